"""torchrun's and DeepSpeed's flags: taken in dslaunch's terms, or answered with what replaces them."""
import json

import pytest
from click.testing import CliRunner

from launcher.cli import command


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("launcher.planning.hostfile.DEFAULT_HOSTFILE", str(tmp_path / "no-default"))
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "hosts").write_text("w0 slots=2\nw1 slots=2\n")
    return lambda *args: CliRunner().invoke(command, list(args))


def plan_of(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_torchrun_and_deepspeed_spellings_mean_the_same(run):
    ours = plan_of(run("-H", "hosts", "--num_nodes", "1", "--num_gpus", "2", "--log_dir", "logs", "--dry-run",
                       "--json", "--launcher", "ssh", "train.py"))
    theirs = plan_of(run("-H", "hosts", "--nnodes", "1", "--nproc_per_node", "2", "--enable_each_rank_log", "logs",
                         "--node_rank", "0", "--dry-run", "--json", "--launcher", "ssh", "train.py"))
    assert theirs == ours


def test_standalone_is_this_machine_on_a_free_port(run):
    plan = plan_of(run("--standalone", "--nproc_per_node", "2", "--dry-run", "--json", "train.py"))
    assert plan["launcher"] == "local" and plan["master_port"] == 0 and plan["world_size"] == 2
    refused = run("--standalone", "-H", "hosts", "--dry-run", "train.py")
    assert refused.exit_code == 2 and "this machine only" in refused.output


def test_standalone_ignores_the_default_hostfile(run, tmp_path, monkeypatch):
    (tmp_path / "job-hostfile").write_text("w0 slots=2\nw1 slots=2\n")
    monkeypatch.setattr("launcher.planning.hostfile.DEFAULT_HOSTFILE", str(tmp_path / "job-hostfile"))
    assert plan_of(run("--nproc_per_node", "2", "--dry-run", "--json", "train.py"))["world_size"] == 4
    plan = plan_of(run("--standalone", "--nproc_per_node", "2", "--dry-run", "--json", "train.py"))
    assert plan["launcher"] == "local" and plan["world_size"] == 2


def test_force_multi_starts_an_agent_even_for_this_machine(run):
    assert plan_of(run("--num_gpus", "1", "--dry-run", "--json", "train.py"))["launcher"] == "local"
    assert plan_of(run("--force_multi", "--num_gpus", "1", "--dry-run", "--json", "train.py"))["launcher"] in ("ssh", "pdsh")


@pytest.mark.parametrize("args, says, hint", [
    (("--tee", "3"), "always streams every rank's stdout and stderr", "--log_dir DIR"),
    (("--redirects", "3"), "always streams", "--log_dir DIR"),
    (("--node_rank", "1"), "dslaunch starts every node itself", "once, with a hostfile"),
])
def test_flags_without_a_counterpart_say_what_replaces_them(run, args, says, hint):
    result = run(*args, "--dry-run", "train.py")
    assert result.exit_code == 2 and says in result.output and hint in result.output
    assert "No such option" not in result.output


def test_bind_cores_to_rank_is_in_the_plan(run):
    assert plan_of(run("--num_gpus", "2", "--bind_cores_to_rank", "--dry-run", "--json", "train.py"))["bind_cores_to_rank"]
    assert not plan_of(run("--num_gpus", "2", "--dry-run", "--json", "train.py"))["bind_cores_to_rank"]
    assert "bound to an even share of its node's cores" in run("--num_gpus", "2", "--bind_cores_to_rank",
                                                                "--dry-run", "train.py").output


@pytest.mark.parametrize("cores, local_rank, ranks, share", [
    ((0, 1, 2, 3), 0, 2, (0, 1)),
    ((0, 1, 2, 3), 1, 2, (2, 3)),
    ((4, 2, 6, 0), 1, 2, (4, 6)),          # in core order, whatever order they came in
    ((0, 1, 2), 1, 2, (1,)),               # the odd core is left to no one, as DeepSpeed does
    ((0,), 1, 2, (0,)),                    # fewer cores than ranks: every rank shares them all
    ((), 0, 2, ()),
])
def test_core_share(cores, local_rank, ranks, share):
    from launcher.node.ranks import core_share
    assert core_share(cores, local_rank, ranks) == share
