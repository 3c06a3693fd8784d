"""Rank side of test_teardown: which torch.distributed threads outlive dslaunch's exit teardown.

An atexit hook registered before ``zero.initialize`` runs after the engine's own (atexit is
last in, first out), so what it sees is what interpreter finalization would inherit. It prints
``LEFT [thread names]``: gloo's worker and socket-loop threads, rank 0's TCPStore server.
With the argument ``script-inits`` the script starts the process group itself first, as many
DeepSpeed scripts do (``dist.init_process_group``), before the engine's modules are imported.
"""
import atexit
import json
import os
import sys


def distributed_threads():
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as handle:
                names.append(handle.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return sorted(name for name in names if "gloo" in name or "tcpstore" in name)


atexit.register(lambda: print("LEFT " + json.dumps(distributed_threads()), flush=True))

import torch  # noqa: E402

from launcher import zero  # noqa: E402


def main():
    if sys.argv[1:] == ["script-inits"]:
        torch.distributed.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    config = {"train_micro_batch_size_per_gpu": 2,
              "zero_optimization": {"stage": 1, "reduce_bucket_size": 8, "overlap_comm": True},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
    engine, _, _, _ = zero.initialize(model=model, config=config)
    for _ in range(2):  # the first optimizer step is what imports torch._dynamo
        loss = engine(torch.randn(2, 4)).square().mean()
        engine.backward(loss)
        engine.step()
    print("RUNNING " + json.dumps(distributed_threads()), flush=True)


if __name__ == "__main__":
    main()
