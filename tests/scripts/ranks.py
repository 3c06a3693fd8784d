"""A rank program for launcher tests (no torch): behaviour chosen by argv.

  echo-args      print each argv item as JSON, then a few env vars as JSON
  fail R CODE [DIR]  rank R exits with CODE after 0.5 s; others sleep 60 s, then print 'slept 60 s
                 unstopped'. With DIR (a folder every node sees) rank R fails only once every rank
                 has printed its pid (each creates DIR/started.<rank> after), not by a clock
  sleep          every rank sleeps 60 s, printing its pid (SIGINT prints 'interrupted')
  kill9 R        rank R kills itself with SIGKILL
  nap S          every rank sleeps S seconds, then prints 'rested' and exits 0
  affinity       print the cores this rank may run on and its OMP_NUM_THREADS
  all-fail CODE T  every rank ignores SIGTERM/SIGINT, waits until epoch time T, says the same
                 line and exits with CODE (all ranks fail alike, within dslaunch's stop grace)
  crash-once R MARKER   rank R exits 3 while MARKER is absent (it creates it); then every rank prints its restart count
  crash-always R CODE   rank R exits CODE on every try, its last line naming the try
  first-try-sleeps      prints WORLD/TRY/NODE/MASTER; sleeps 60 s on the first try, exits 0 on later ones
"""
import json
import os
import signal
import sys
import time

rank = int(os.environ["RANK"])
args = [a for a in sys.argv[1:] if not a.startswith("--local_rank=")]
mode = args[0]
print(f"pid {os.getpid()} rank {rank}", flush=True)
if mode == "echo-args":
    print("ARGS " + json.dumps(sys.argv[1:]), flush=True)
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
            "GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS", "DSL_TEST_FORWARD", "NCCL_TEST_VALUE", "DSL_TEST_ENV"]
    print("ENV " + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
elif mode == "fail":
    if len(args) > 3:
        open(os.path.join(args[3], f"started.{rank}"), "w").close()
    if rank == int(args[1]):
        while len(args) > 3 and len(os.listdir(args[3])) < int(os.environ["WORLD_SIZE"]):
            time.sleep(0.02)
        time.sleep(0.5)
        print("failing on purpose", file=sys.stderr, flush=True)
        sys.exit(int(args[2]))
    time.sleep(60)
    print("slept 60 s unstopped", flush=True)   # a test of the stop fails on this line, not on a clock
elif mode == "sleep":
    try:
        time.sleep(60)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(1)
elif mode == "nap":
    time.sleep(float(args[1]))
    print("rested", flush=True)
elif mode == "kill9":
    if rank == int(args[1]):
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
elif mode == "all-fail":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    time.sleep(max(0.0, float(args[2]) - time.time()))
    print("failing the same way", file=sys.stderr, flush=True)
    sys.exit(int(args[1]))
elif mode == "affinity":
    print("AFFINITY " + json.dumps({"rank": rank, "local_rank": int(os.environ["LOCAL_RANK"]),
                                    "cores": sorted(os.sched_getaffinity(0)),
                                    "omp": os.environ.get("OMP_NUM_THREADS")}), flush=True)
elif mode == "crash-once":
    # crash-once R MARKER: rank R exits 3 on the first try (no MARKER file yet), then all succeed
    if rank == int(args[1]) and not os.path.exists(args[2]):
        open(args[2], "w").close()
        print("crashing once", file=sys.stderr, flush=True)
        sys.exit(3)
    time.sleep(0.5)
    print("RESTART_COUNT " + json.dumps({k: os.environ.get(k) for k in
                                         ("DSLAUNCH_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")}), flush=True)
elif mode == "crash-always":
    # crash-always R CODE: rank R exits CODE on every try, its message naming the try
    if rank == int(args[1]):
        time.sleep(0.5)
        print(f"crash on try {os.environ.get('DSLAUNCH_RESTART_COUNT')}", file=sys.stderr, flush=True)
        sys.exit(int(args[2]))
    time.sleep(60)
elif mode == "first-try-sleeps":
    restart = os.environ.get("DSLAUNCH_RESTART_COUNT")
    print(f"WORLD {os.environ['WORLD_SIZE']} TRY {restart} NODE {os.environ['NODE_RANK']} "
          f"MASTER {os.environ['MASTER_ADDR']}", flush=True)
    if restart == "0":
        time.sleep(60)
