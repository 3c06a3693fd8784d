"""--stall_timeout, taking a rank's stack (launcher/node/stack_dump.py) from real processes: the
bootstrap put on PYTHONPATH (rank_site/sitecustomize.py) arms faulthandler before the script runs,
SIGUSR1 dumps every thread into the rank's file, and the main thread is read back with its source
lines. No torch: plain Python ranks."""
import os
import subprocess
import sys
import time

from launcher.node.process import RankSpec, spawn, stop_processes
from launcher.node.stack_dump import SITE_DIR, STACKS_VARIABLE, rank_env, sample_stacks, stacks_path, take_dumps

STUCK = '''import threading, time
def beside():
    time.sleep(600)
def load_batch():
    print("ready", flush=True)
    time.sleep(600)
threading.Thread(target=beside, daemon=True).start()
load_batch()
'''


def start(tmp_path, argv, rank=0, env=None):
    """A rank started as the supervisor starts one under --stall_timeout; waits for its "ready" line."""
    lines = []
    spec = RankSpec(rank=rank, local_rank=rank, argv=tuple(argv), cwd=str(tmp_path),
                    env=rank_env({**os.environ, **(env or {})}, str(tmp_path), rank))
    proc = spawn(spec, lambda event: lines.append(event.line))
    deadline = time.monotonic() + 60
    while "ready" not in lines and proc.popen.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc


def script(tmp_path, text=STUCK, name="stuck.py"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_python_rank_gives_its_main_threads_stack_with_its_source_lines(tmp_path):
    proc = start(tmp_path, [sys.executable, script(tmp_path)])
    try:
        dumps = take_dumps([proc], str(tmp_path))
    finally:
        stop_processes([proc.popen], grace=1.0)
    stack = dumps[0].stack()
    assert [(f.function, f.line) for f in stack.frames] == [("load_batch", 6), ("<module>", 8)], dumps[0].text
    assert stack.frames[0].code == "time.sleep(600)"
    assert "in beside" in dumps[0].text   # every thread was dumped; the main one was picked


def test_a_rank_behind_a_wrapper_is_asked_through_the_python_it_started(tmp_path):
    path = script(tmp_path)
    proc = start(tmp_path, ["bash", "-c", f'"{sys.executable}" "{path}"; exit 0'])   # as --no_python wrappers do
    try:
        stack = take_dumps([proc], str(tmp_path))[0].stack()
        alive = proc.popen.poll() is None   # bash itself never got SIGUSR1 (it would have died of it)
    finally:
        stop_processes([proc.popen], grace=1.0)
    assert stack.frames and stack.frames[0].function == "load_batch"
    assert alive


def test_a_rank_that_skips_pythonpath_says_so_instead_of_a_stack(tmp_path):
    proc = start(tmp_path, [sys.executable, "-I", script(tmp_path)])
    try:
        dump = take_dumps([proc], str(tmp_path))[0]
    finally:
        stop_processes([proc.popen], grace=1.0)
    assert dump.stack().frames == () and "armed the dump" in dump.stack().note


def test_a_script_that_takes_sigusr1_for_itself_gives_no_dump_and_lives_on(tmp_path):
    own = "import signal\nsignal.signal(signal.SIGUSR1, lambda *a: None)\n" + STUCK
    proc = start(tmp_path, [sys.executable, script(tmp_path, own)])
    try:
        dump = take_dumps([proc], str(tmp_path), wait_s=0.5)[0]
        alive = proc.popen.poll() is None
    finally:
        stop_processes([proc.popen], grace=1.0)
    assert alive and "no dump within 0.5 s" in dump.note


def test_the_bootstrap_hands_over_to_the_next_sitecustomize_and_leaves_sys_path_alone(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE'] = 'ran'\n")
    check = "import os, sys; print(os.environ.get('OTHER_SITE'), any('rank_site' in p for p in sys.path))"
    env = rank_env({**os.environ, "PYTHONPATH": str(other)}, str(tmp_path), 3)
    done = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=60)
    assert (done.stdout.strip(), done.stderr) == ("ran False", "")
    assert env["PYTHONPATH"].split(os.pathsep)[0] == SITE_DIR
    assert open(stacks_path(str(tmp_path), 3)).read().startswith("dslaunch-stacks pid=")


def test_without_the_variable_the_bootstrap_does_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != STACKS_VARIABLE}
    env["PYTHONPATH"] = SITE_DIR
    done = subprocess.run([sys.executable, "-c", "import faulthandler, signal; print('ok')"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "ok", "")
    assert list(tmp_path.iterdir()) == []


BUSY = '''import time
def deeper(depth):   # a busy rank, made certain: one frame deeper every 0.1 s, never twice in one place
    time.sleep(0.1)
    deeper(depth + 1)
print("ready", flush=True)
deeper(0)
'''


def test_dumps_a_moment_apart_tell_a_busy_rank_from_a_hung_one(tmp_path):
    hung = start(tmp_path, [sys.executable, script(tmp_path)], rank=0)
    busy = start(tmp_path, [sys.executable, script(tmp_path, BUSY, "busy.py")], rank=1)
    try:
        stacks = {stack.rank: stack for stack in sample_stacks([hung, busy], str(tmp_path), gap_s=0.5)}
    finally:
        stop_processes([hung.popen, busy.popen], grace=1.0)
    assert stacks[0].frames[0].function == "load_batch" and not stacks[0].moved
    assert stacks[1].frames and stacks[1].moved
