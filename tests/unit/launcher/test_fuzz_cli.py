"""The CLI under generated argument lists: `--dry-run --json` prints a plan, or a typed error exits 2.

Each example writes a hostfile, a .deepspeed_env and a config (each good, bad or absent) and
runs `dslaunch` through click's CliRunner with valid and invalid flags mixed. `--dry-run` starts
nothing; the only I/O is reading those files and resolving the first host's name (ssh -G, DNS).
"""
import json

import pytest
from click.testing import CliRunner
from hypothesis import example, given, strategies as st

from launcher.cli import command
from tests.helpers.fuzz import fewer, record

HOST_LINES = st.one_of(
    st.sampled_from(["localhost slots=2", "w0 slots=2", "w1 slots=4", "u@w2:2222 slots=1", "# c", ""]),
    st.sampled_from(["w0 slots=0", "w3 slots=\u00b2", "w0 slots=2", "x..y slots=1", "a" * 70 + " slots=1",
                     "w\x00 slots=1", "w4 slots=99999999", "w5 slots=2 extra", "w6:0 slots=1"]),
    st.text(max_size=10))
ENV_LINES = st.sampled_from(["NCCL_DEBUG=INFO", "export A='1'", "B=\"x y\"", "bad line", "C=a\x00b", "", "# c", "1X=2"])
CONFIGS = st.one_of(
    st.sampled_from(['{"train_batch_size": 8}', '{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}',
                     '{"train_batch_size": 7}', '{"zero_optimization": {"stage": 9}}', '{"bogus": 1}', "{", "[]",
                     '{"train_batch_size": 1' + "0" * 400 + "}", '{"optimizer": {"type": "Adam", "params": {"lr": 1}}}',
                     '{"pipeline": {"stages": 2}, "train_batch_size": 8}', "\ufeff{}"]),
    st.text(max_size=10)).map(str.encode) | st.sampled_from([b"\xff\xfe{}", b'{"a": "\xe9"}'])

NUMBERS = st.one_of(st.integers(-2, 5).map(str), st.sampled_from(["0", "x", "", "1.5", "nan", "inf", "-inf", "1e3",
                                                                   "99999999999", "\u00b2", "9" * 30]))
SPECS = st.sampled_from(["w0", "w1:0", "localhost", "w0@w1", "w9", "w0:9", "w0:\u00b2", "", "@", "w0::1", "w0:1,,2"])
FLAGS = st.one_of(
    st.tuples(st.sampled_from(["-i", "--include", "-e", "--exclude"]), SPECS),
    st.tuples(st.sampled_from(["--num_nodes", "--num_gpus", "--nproc_per_node", "--master_port", "--ssh_port",
                               "--max_restarts", "--min_nodes", "--heartbeat_timeout", "--stall_timeout",
                               "--node_rank"]), NUMBERS),
    st.tuples(st.sampled_from(["--launcher"]), st.sampled_from(["local", "ssh", "pdsh", "PDSH", "slurm", "nope", ""])),
    st.tuples(st.sampled_from(["--output"]), st.sampled_from(["all", "rank0", "none", "bad"])),
    st.tuples(st.sampled_from(["--env"]), ENV_LINES),
    st.tuples(st.sampled_from(["--master_addr", "--launcher_args", "--workdir", "--remote_python"]),
              st.sampled_from(["10.0.0.1", "-x 'unclosed", "", "\u00e9", "a b"])),
    st.tuples(st.sampled_from(["--config"]), st.sampled_from(["ds.json", "ds.yaml", "missing.json"])),
    st.tuples(st.sampled_from(["--standby_hosts"]), st.sampled_from(["spares", "hosts", "nope"])),
    st.just(("-H", "hosts")), st.just(("--hostfile", "missing")),
    st.sampled_from([("-m",), ("--no_python",), ("--no_local_rank",), ("--as-deepspeed",), ("--standalone",),
                     ("--force_multi",), ("--bind_cores_to_rank",), ("--no-preflight",), ("--show-secrets",),
                     ("--tee", "3"), ("--bogus",), ("-i",), ("--num_gpus",), ("--num-gpus", "1")]),
)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("launcher.planning.hostfile.DEFAULT_HOSTFILE", str(tmp_path / "default-hostfile"))
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def write(folder, name, content):
    """Write `content` to folder/name, or remove the file when content is None (examples share the folder)."""
    path = folder / name
    if content is None:
        path.unlink(missing_ok=True)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")


@fewer(2)
@given(hostfile=st.none() | st.lists(HOST_LINES, max_size=5).map("\n".join),
       default=st.none() | st.just("localhost slots=2"),
       env_file=st.none() | st.lists(ENV_LINES, max_size=3).map("\n".join),
       config=CONFIGS, spares=st.none() | st.just("w7 slots=2"),
       flags=st.lists(st.sampled_from([("-H", "hosts"), ("--config", "ds.json"), ("--config", "ds.yaml")]),
                      max_size=2, unique=True).flatmap(lambda files: st.lists(FLAGS, max_size=4).map(files.__add__)), script=st.sampled_from(["train.py", "train.py", "nope.py", None]),
       gpus=st.sampled_from(["", "", "0,1", "0", "a,b"]))
@example(hostfile="x..y slots=1", default=None, env_file=None, config=b"{}", spares=None, flags=[("-H", "hosts")],
         script="train.py", gpus="")          # getaddrinfo raised UnicodeError (an empty DNS label)
@example(hostfile=None, default=None, env_file=None, config=b"{}", spares=None, flags=[("--num_gpus", "99999999999")],
         script="train.py", gpus="")          # planned 10**11 CPU ranks: memory ran out
@example(hostfile=None, default=None, env_file=None, config=b"\xff{}", spares=None, flags=[("--config", "ds.json")],
         script="train.py", gpus="")          # UnicodeDecodeError from the config loader
@example(hostfile="w0 slots=1\nw1 slots=1", default=None, env_file=None, config=b"{}", spares=None,
         flags=[("-H", "hosts"), ("--launcher", "pdsh"), ("--launcher_args", "-x 'unclosed")],
         script="train.py", gpus="")          # shlex.split raised ValueError: No closing quotation
def test_the_cli_plans_or_exits_2_with_a_message(workdir, hostfile, default, env_file, config, spares, flags,
                                                 script, gpus):
    write(workdir, "hosts", hostfile)
    write(workdir, "default-hostfile", default)
    write(workdir, ".deepspeed_env", env_file)
    write(workdir, "ds.json", config)
    write(workdir, "ds.yaml", config)
    write(workdir, "spares", spares)
    args = [part for flag in flags for part in flag] + ["--dry-run", "--json"] + ([script] if script else [])
    environ = {"HOME": str(workdir / "home"), "CUDA_VISIBLE_DEVICES": gpus, "DS_ENV_FILE": None,
               "DSLAUNCH_DEBUG": None, "SLURM_JOB_NODELIST": None, "SLURM_NODELIST": None}
    result = CliRunner(env=environ).invoke(command, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exc_info)
    assert "Traceback" not in result.output, (args, result.output)
    if result.exit_code == 0:
        record("cli")
        document = json.loads(result.stdout, parse_constant=_no_constants)   # strict JSON: no NaN/Infinity
        assert document["world_size"] == sum(len(n["ranks"]) for n in document["nodes"]) >= 1
        return
    first = result.stderr.splitlines()[0] if result.stderr else ""
    _, kind, message = (first.split(": ", 2) + ["", ""])[:3]
    record("cli", label=f"exit {result.exit_code} {kind}", message=message)
    assert result.exit_code == 2, (args, result.exit_code, result.output)
    assert first.startswith("dslaunch: ") and message, (args, result.stderr)


def _no_constants(name):
    raise AssertionError(f"--json printed {name}, which is not JSON")

