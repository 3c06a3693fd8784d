"""--stall_timeout, a hung job: faulthandler's dump read back (launcher/node/stacks.py) and each
rank's main thread placed inside a collective, autograd's backward, or its own work. Pure."""
import pytest

from launcher.node.stacks import (Frame, RankStack, armed, main_thread, place_of, stack_from_json, threads)

SITE = "/venv/lib/python3.11/site-packages"
# as faulthandler wrote them for the script (a gloo all_reduce on rank 0, a sleeping loader on rank 1)
IN_ALL_REDUCE = f"""dslaunch-stacks pid=4937 main_thread=0x7ff63eb1eb80
Thread 0x00007ff63a3fe6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "{SITE}/tqdm/_monitor.py", line 60 in run

Current thread 0x00007ff63eb1eb80 (most recent call first):
  File "{SITE}/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "{SITE}/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/tmp/stuck.py", line 17 in main
  File "/tmp/stuck.py", line 22 in <module>
"""
IN_LOADER = """Thread 0x00007f9e7cc09b80 (most recent call first):
  File "/tmp/stuck.py", line 9 in load_batch
  File "/tmp/stuck.py", line 16 in main
  File "/tmp/stuck.py", line 22 in <module>
"""


def stack(*frames, note=""):
    """RankStack from ("file", line, "function"[, "code"]) tuples, innermost first."""
    return RankStack(0, tuple(Frame(*frame) for frame in frames), note)


def test_the_bootstrap_header_names_the_process_and_its_main_thread():
    assert armed(IN_ALL_REDUCE) == [(4937, 0x7ff63eb1eb80)]
    assert armed("dslaunch-stacks pid=1 main_thread=0x1\nnoise\ndslaunch-stacks pid=2 main_thread=0xff\n") == \
        [(1, 1), (2, 255)]


def test_every_thread_is_read_innermost_first_and_the_main_one_is_picked_by_its_id():
    found = threads(IN_ALL_REDUCE)
    assert [(ident, current, len(frames)) for ident, current, frames in found] == \
        [(0x7ff63a3fe6c0, False, 2), (0x7ff63eb1eb80, True, 4)]
    main = main_thread(IN_ALL_REDUCE, 0x7ff63eb1eb80)
    assert main[0] == Frame(f"{SITE}/torch/distributed/distributed_c10d.py", 3252, "all_reduce")
    assert main[-1].where() == "/tmp/stuck.py:22 in <module>"


def test_without_a_known_id_the_main_thread_is_the_oldest_one_cpython_lists_last():
    assert main_thread(IN_ALL_REDUCE, None)[0].function == "all_reduce"
    assert main_thread(IN_ALL_REDUCE, 0x1234)[0].function == "all_reduce"
    assert main_thread(IN_LOADER, None)[0].function == "load_batch"


@pytest.mark.parametrize("text", ["", "\x00\xff garbage", "Thread 0xzz (most recent call first):",
                                  '  File "x.py", line 3 in f',   # a frame before any thread: dropped
                                  'Stack (most recent call first):\n  File "a.py", line ??? in f\n  ...',
                                  "dslaunch-stacks pid=x main_thread=0x1"])
def test_damaged_or_odd_dumps_give_what_they_hold_and_never_raise(text):
    frames = main_thread(text, None)
    assert all(isinstance(frame, Frame) for frame in frames)
    assert armed(text) == []


def test_a_dump_of_one_thread_and_an_unknown_line_number_are_read():
    frames = main_thread('Stack (most recent call first):\n  File "a.py", line ??? in f\n', None)
    assert frames == [Frame("a.py", 0, "f")]


def test_the_agents_record_comes_back_and_junk_is_refused_not_raised():
    sent = stack(("/a.py", 3, "f", "x = 1"), ("/a.py", 9, "<module>"))
    assert stack_from_json(sent.to_json()) == sent
    for junk in (None, 3, "x", {}, {"rank": "one"}, {"rank": 1, "frames": [[1]]}, {"rank": 1, "frames": 5}):
        assert stack_from_json(junk) is None


PLACES = [   # (frames innermost first, kind, name, where the script called it)
    (main_thread(IN_ALL_REDUCE, None), "collective", "all_reduce", "/tmp/stuck.py:17 in main"),
    (main_thread(IN_LOADER, None), "other", "load_batch", None),
    ([(f"{SITE}/torch/distributed/distributed_c10d.py", 4700, "barrier"), ("/t.py", 5, "main")],
     "collective", "barrier", "/t.py:5 in main"),
    ([(f"{SITE}/torch/distributed/distributed_c10d.py", 2000, "_store_based_barrier"),
      (f"{SITE}/torch/distributed/distributed_c10d.py", 1900, "init_process_group"), ("/t.py", 2, "setup")],
     "collective", "init_process_group", "/t.py:2 in setup"),
    ([(f"{SITE}/deepspeed/comm/torch.py", 200, "log_wrapper"), (f"{SITE}/deepspeed/comm/comm.py", 40, "broadcast"),
      ("/t.py", 7, "sync")], "collective", "broadcast", "/t.py:7 in sync"),
    ([("/repo/launcher/zero/distributed/collectives.py", 67, "wait"),
      ("/repo/launcher/zero/stages/base.py", 190, "reduce_gradients")],
     "collective", "wait", "/repo/launcher/zero/stages/base.py:190 in reduce_gradients"),
    ([("/t.py", 30, "step", "handle.wait()"), ("/t.py", 40, "main")],   # Work.wait is C: the script's own line
     "collective", "wait (an async collective's handle)", "/t.py:30 in step"),
    ([("/t.py", 30, "reap", "os.wait()")], "other", "reap", None),
    ([("/t.py", 30, "step", "done.wait_stream(s)")], "other", "step", None),
    ([(f"{SITE}/torch/autograd/graph.py", 825, "_engine_run_backward"),
      (f"{SITE}/torch/autograd/__init__.py", 350, "backward"), (f"{SITE}/torch/_tensor.py", 640, "backward"),
      ("/t.py", 12, "train")], "backward", "backward", "/t.py:12 in train"),
    ([(f"{SITE}/torch/cuda/__init__.py", 980, "synchronize"), ("/t.py", 3, "f")],
     "collective", "torch.cuda.synchronize (the GPU's queue, often a collective's kernel)", "/t.py:3 in f"),
    ([("/usr/lib/python3.11/threading.py", 327, "wait"), ("/usr/lib/python3.11/queue.py", 180, "get"),
      (f"{SITE}/torch/utils/data/dataloader.py", 1130, "_try_get_data")], "other", "wait", None),
]


@pytest.mark.parametrize("frames, kind, name, caller", PLACES)
def test_a_rank_is_placed_by_its_innermost_frames(frames, kind, name, caller):
    frames = [frame if isinstance(frame, Frame) else Frame(*frame) for frame in frames]
    place = place_of(RankStack(0, tuple(frames)))
    assert (place.kind, place.name) == (kind, name)
    assert (place.caller.where() if place.caller else None) == caller


def test_a_rank_without_frames_is_unknown_and_says_why():
    place = place_of(stack(note="no Python process of the rank armed the dump"))
    assert (place.kind, place.name) == ("unknown", "no Python process of the rank armed the dump")
    assert place_of(stack()).name == "no Python frame"
