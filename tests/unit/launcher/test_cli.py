"""The CLI through click's CliRunner: exit codes, messages, no traceback, no torch."""
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from launcher.cli import command

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("launcher.planning.hostfile.DEFAULT_HOSTFILE", str(tmp_path / "no-default"))
    (tmp_path / "train.py").write_text("print('hi')\n")

    def invoke(*args):
        result = CliRunner().invoke(command, list(args))
        assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), \
            result.exception
        return result
    return invoke


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_dry_run_json_matches_the_contract(run, tmp_path):
    hosts = write(tmp_path, "hosts", "worker-0 slots=2\nworker-1 slots=2\n")
    result = run("-H", hosts, "--master_addr", "10.0.0.1", "--launcher", "pdsh", "--dry-run", "--json",
                 "train.py", "--lr", "1e-3")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["world_size"], doc["master_addr"], doc["master_port"], doc["launcher"]) == \
        (4, "10.0.0.1", 29500, "pdsh")
    node = doc["nodes"][1]
    assert (node["host"], node["node_rank"], node["slots"]) == ("worker-1", 1, [0, 1])
    assert node["command"][0] == "pdsh"
    rank = node["ranks"][1]
    assert rank["rank"] == 3 and rank["local_rank"] == 1
    assert rank["argv"][1:] == ["-u", "train.py", "--local_rank=1", "--lr", "1e-3"]
    assert rank["env"]["RANK"] == "3" and rank["env"]["WORLD_SIZE"] == "4"


def test_dry_run_text(run):
    result = run("--num_gpus", "2", "--dry-run", "train.py")
    assert result.exit_code == 0
    assert "world_size 2" in result.stdout and "rank 1 (local 1)" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["-H", "missing-file", "--dry-run", "train.py"], "hostfile 'missing-file' does not exist"),
    (["--dry-run", "nope.py"], "script 'nope.py' not found"),
    (["--dry-run"], "missing SCRIPT"),
    (["-i", "localhost", "--num_gpus", "1", "--dry-run", "train.py"], "cannot be combined"),
    (["-i", "ghost", "--dry-run", "train.py"], "host 'ghost' is unknown: without a hostfile only this machine"),
    (["--json", "train.py"], "--json goes with"),
    (["--env", "NOEQUALS", "--dry-run", "train.py"], "expected KEY=VALUE"),
    (["--launcher", "nope", "train.py"], "Invalid value for '--launcher'"),
    (["--no_such_option", "train.py"], "No such option"),
    (["--num_gpus", "x", "train.py"], "is not a valid integer"),
    # nan passed a '<= 0' check and inf never elapses (found by the fuzz tests' author, issue 42)
    (["--stall_timeout", "nan", "--dry-run", "train.py"], "--stall_timeout must be a number of seconds > 0"),
    (["--stall_timeout", "inf", "--dry-run", "train.py"], "--stall_timeout must be a number of seconds > 0"),
    (["--heartbeat_timeout", "nan", "--dry-run", "train.py"], "--heartbeat_timeout must be a number of seconds > 0"),
    (["--heartbeat_timeout", "-inf", "--dry-run", "train.py"], "--heartbeat_timeout must be a number of seconds > 0"),
])
def test_bad_input_exits_2_with_a_message(run, args, message):
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_bad_hostfile_names_file_and_line(run, tmp_path):
    hosts = write(tmp_path, "hosts", "w0 slots=2\nw1 slots=two\n")
    result = run("-H", hosts, "--dry-run", "train.py")
    assert result.exit_code == 2
    assert f"{hosts}:2: slots must be a whole number >= 1, got 'two'" in result.output
    assert "hint:" in result.output


@pytest.mark.parametrize("spelling", [["--num_gpus", "2"], ["--num-gpus", "2"], ["--nproc-per-node", "2"],
                                      ["--nproc_per_node", "2"]])
def test_both_spellings(run, spelling):
    result = run(*spelling, "--dry_run", "--json", "train.py")
    assert json.loads(result.stdout)["world_size"] == 2


def test_env_file_with_comments_reaches_plan(run, tmp_path):
    write(tmp_path, ".deepspeed_env", "# comment\n\nFOO=bar baz\n")
    result = run("--num_gpus", "1", "--dry-run", "--json", "--env", "X=1", "train.py")
    env = json.loads(result.stdout)["nodes"][0]["ranks"][0]["env"]
    assert env["FOO"] == "bar baz" and env["X"] == "1"


def test_help_and_dry_run_never_import_torch(tmp_path):
    (tmp_path / "t.py").write_text("")
    code = ("import sys; from launcher.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit: pass\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    for args in (["--help"], ["--num_gpus", "2", "--dry-run", "t.py"]):
        done = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": ROOT})
        assert done.returncode == 0, done.stderr


def test_python_dash_m_launcher_works(tmp_path):
    done = subprocess.run([sys.executable, "-m", "launcher", "--version"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0 and "dslaunch" in done.stdout


def test_slurm_allocation_gives_the_nodes(run, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gn[01-02]")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "4")
    doc = json.loads(run("--launcher", "slurm", "--dry-run", "--json", "train.py").stdout)
    assert (doc["master_addr"], doc["world_size"]) == ("gn01", 8)
    assert doc["nodes"][1]["command"][:2] == ["srun", "--nodes"]
    assert doc["nodes"][1]["ranks"][0]["env"]["RANK"] == "4"


def test_slurm_outside_an_allocation_is_a_clear_error(run, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    monkeypatch.delenv("SLURM_NODELIST", raising=False)
    result = run("--launcher", "slurm", "--dry-run", "train.py")
    assert result.exit_code == 2 and "needs a Slurm allocation" in result.output


@pytest.mark.parametrize("config, message", [
    ('{"train_batch_size": 8, "zero_optimisation": {"stage": 2}}', "did you mean 'zero_optimization'"),
    ('{"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2}', "train_batch_size (7) is not equal"),
])
def test_dry_run_validates_the_engine_config_against_the_world_size(run, tmp_path, config, message):
    path = write(tmp_path, "ds.json", config)
    result = run("--num_gpus", "2", "--dry-run", "--config", path, "train.py")
    assert result.exit_code == 2 and message in result.output


def test_dry_run_checks_the_optimizer_as_initialize_does_naming_the_file(run, tmp_path):
    path = write(tmp_path, "ds.json", '{"train_batch_size": 8, "optimizer": {"type": "AdamWW", "params": {}}}')
    result = run("--num_gpus", "2", "--dry-run", "--config", path, "train.py")
    assert result.exit_code == 2, result.output
    assert f"config error: {path}: optimizer.type: unknown optimizer 'AdamWW'" in result.output
    assert "did you mean 'AdamW'?" in result.output


def test_dry_run_accepts_a_good_config(run, tmp_path):
    path = write(tmp_path, "ds.json", '{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2}')
    result = run("--num_gpus", "2", "--dry-run", "--json", "--config", path, "train.py")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["nodes"][0]["ranks"][0]["env"]["DSLAUNCH_CONFIG"] == path


def test_clicks_own_option_errors_are_in_dslaunchs_style(run):
    for args, says in ((["--nosuch", "train.py"], "No such option '--nosuch'"),
                       (["--num_gpus", "x", "train.py"], "Invalid value for '--num_gpus': 'x' is not a valid integer")):
        result = run(*args)
        assert result.exit_code == 2
        assert result.output.startswith(f"dslaunch: usage error: {says}"), result.output
        assert "  hint: dslaunch --help lists every option" in result.output and "Try 'dslaunch" not in result.output
