"""Put first on a rank's PYTHONPATH by the node supervisor under ``--stall_timeout``: arms a stack dump.

Python imports ``sitecustomize`` at start-up, before the script, so every Python rank (and every
Python process it starts) registers ``faulthandler`` on SIGUSR1, writing all its threads' stacks
into the per-rank file named by ``DSLAUNCH_STACKS_FILE``. It first appends one line there,
``dslaunch-stacks pid=<pid> main_thread=0x<id>``, so the supervisor knows which process to ask
and which of the dumped threads is the main one. faulthandler writes from its C signal handler:
the dump comes even while the main thread is blocked inside a C call (a collective's wait, a
read on a hung file system), where a Python-level handler would never run; and it needs no
ptrace rights (py-spy does, which containers often deny). Standalone (imports nothing of the
launcher, nor torch); then hands over to the next ``sitecustomize`` on the path, if any, as if
this one were not there. Never fails the rank: without the file or SIGUSR1 it does nothing.
"""
import os
import sys

VARIABLE = "DSLAUNCH_STACKS_FILE"   # launcher/node/stack_dump.py names it


def _arm(path):
    import _thread
    import faulthandler
    import signal
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)   # close-on-exec: children open their own
        os.write(fd, f"dslaunch-stacks pid={os.getpid()} main_thread={_thread.get_ident():#x}\n".encode())
        faulthandler.register(signal.SIGUSR1, file=fd, all_threads=True, chain=False)
    except (OSError, ValueError, AttributeError, RuntimeError):   # no file system, no SIGUSR1: no stacks
        return


def _next_sitecustomize():
    """Import the sitecustomize this one hides (a distribution's or the user's), as site would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    mine = sys.modules.pop("sitecustomize", None)
    saved = sys.path[:]
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    try:
        import sitecustomize  # noqa: F401  (the next one; its errors are reported by site as usual)
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
        sys.modules["sitecustomize"] = mine   # none further: the import that loaded this one finds it
    finally:
        sys.path[:] = [entry for entry in saved if os.path.abspath(entry or os.curdir) != here]


if os.environ.get(VARIABLE):
    _arm(os.environ[VARIABLE])
_next_sitecustomize()
