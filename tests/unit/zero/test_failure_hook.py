"""The rank failure hook: a peer's exit seen from another rank is one line, not a traceback."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def run_rank(body: str, rank: str = "1", install: bool = True):
    script = ("import launcher.zero.failure as failure\n"
              "failure.OTHER_RANKS_WAIT_S = 0.0\n"
              + ("failure.install_from_env()\n" if install else "") + body)
    env = {**os.environ, "RANK": rank, "PYTHONPATH": ROOT}
    env.pop("DSLAUNCH_DEBUG", None)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)


def test_a_store_or_link_lost_to_a_peer_is_one_line_with_a_non_zero_exit():
    done = run_rank("raise RuntimeError('[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242')")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        "dslaunch: rank 1: a peer went away (RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by "
        "peer [127.0.0.1]:4242)"]


def test_a_rank_s_own_error_keeps_its_traceback():
    done = run_rank("raise RuntimeError('shapes do not match')")
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "shapes do not match" in done.stderr and "went away" not in done.stderr


def test_a_config_error_raised_by_zero_init_is_one_message():
    done = run_rank("from launcher import zero\nzero.Init(config_dict_or_path={'fp61': {}})", rank="0",
                    install=False)   # zero.Init installs the hook itself
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "dslaunch: config error: config dict passed to zero.Init: unknown config key 'fp61'" in done.stderr
