"""The launch plan: ranks, env and argv per rank, as a pure function."""
import pytest

from launcher.errors import FilterError, UsageError
from launcher.planning.hostfile import parse_hostfile
from launcher.planning.plan import LaunchOptions, Machine, build_plan, with_master_port

HOSTS = parse_hostfile("nodeA slots=2\nnodeB slots=3\n", "hosts")


def machine(**kw):
    base = dict(python="/py", cwd="/work", environ={"PATH": "/bin", "NCCL_DEBUG": "INFO", "SECRET": "x",
                                                    "CUDA_VISIBLE_DEVICES": "5", "WANDB_API_KEY": "k"},
                pdsh_available=True, resolve=lambda h: {"nodeA": "10.0.0.1"}.get(h, h))
    base.update(kw)
    return Machine(**base)


def plan_for(hosts=HOSTS, **kw):
    return build_plan(hosts, LaunchOptions(script="train.py", **kw), machine())


def test_ranks_follow_node_then_slot_order_and_local_rank_restarts():
    plan = plan_for(include="nodeA@nodeB:0,2,1")
    table = [(n.host, r.rank, r.local_rank, r.env["CUDA_VISIBLE_DEVICES"]) for n in plan.nodes for r in n.ranks]
    assert table == [("nodeA", 0, 0, "0,1"), ("nodeA", 1, 1, "0,1"),
                     ("nodeB", 2, 0, "0,1,2"), ("nodeB", 3, 1, "0,1,2"), ("nodeB", 4, 2, "0,1,2")]
    assert plan.world_size == 5


def test_every_rank_gets_the_full_env():
    plan = plan_for(master_port=1234)
    env = plan.nodes[1].ranks[2].env
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "NODE_RANK",
                                "GROUP_RANK", "CROSS_RANK", "CROSS_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                "CUDA_VISIBLE_DEVICES")} == {
        "RANK": "4", "LOCAL_RANK": "2", "WORLD_SIZE": "5", "LOCAL_WORLD_SIZE": "3", "LOCAL_SIZE": "3",
        "NODE_RANK": "1", "GROUP_RANK": "1", "CROSS_RANK": "1", "CROSS_SIZE": "2", "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "1234", "CUDA_VISIBLE_DEVICES": "0,1,2"}


def test_env_mapping_is_fresh_per_rank():
    plan = plan_for()
    envs = [r.env for n in plan.nodes for r in n.ranks]
    assert len({id(e) for e in envs}) == len(envs)


def test_remote_nodes_get_the_forwarding_policy_not_everything():
    env = plan_for().nodes[0].ranks[0].env
    assert env["NCCL_DEBUG"] == "INFO" and env["PATH"] == "/bin" and env["WANDB_API_KEY"] == "k"
    assert "SECRET" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"  # ours, never the launcher's
    assert env["PYTHONPATH"] == "/work"


def test_env_options_and_files_override_forwarded_and_reserved_names_win():
    m = machine(env_files={"NCCL_DEBUG": "WARN", "A": "file"})
    plan = build_plan(HOSTS, LaunchOptions(script="t.py", env=("A=cli", "B=x=y", "RANK=9")), m)
    env = plan.nodes[0].ranks[1].env
    assert (env["NCCL_DEBUG"], env["A"], env["B"], env["RANK"]) == ("WARN", "cli", "x=y", "1")


@pytest.mark.parametrize("options, argv", [
    ({}, ["/py", "-u", "train.py", "--local_rank=1", "a b", "$x;*"]),
    ({"no_local_rank": True}, ["/py", "-u", "train.py", "a b", "$x;*"]),
    ({"module": True}, ["/py", "-u", "-m", "train.py", "--local_rank=1", "a b", "$x;*"]),
    ({"no_python": True}, ["train.py", "--local_rank=1", "a b", "$x;*"]),
    ({"remote_python": "/opt/py"}, ["/opt/py", "-u", "train.py", "--local_rank=1", "a b", "$x;*"]),
    ({"as_deepspeed": True}, ["/py", "-u", "-m", "launcher.zero.shim", "train.py", "--local_rank=1", "a b", "$x;*"]),
    ({"as_deepspeed": True, "module": True},
     ["/py", "-u", "-m", "launcher.zero.shim", "-m", "train.py", "--local_rank=1", "a b", "$x;*"]),
])
def test_argv(options, argv):
    plan = build_plan(HOSTS, LaunchOptions(script="train.py", script_args=("a b", "$x;*"), **options), machine())
    assert list(plan.nodes[0].ranks[1].argv) == argv


def test_no_hostfile_and_no_gpu_gives_cpu_ranks():
    plan = build_plan(None, LaunchOptions(script="t.py", num_gpus=3), machine())
    assert (plan.launcher, plan.world_size, plan.master_addr) == ("local", 3, "127.0.0.1")
    assert plan.notes and "CPU" in plan.notes[0]
    assert "NCCL_DEBUG" not in plan.nodes[0].ranks[0].env  # local ranks inherit instead


def test_no_hostfile_uses_visible_gpu_ids():
    plan = build_plan(None, LaunchOptions(script="t.py", num_gpus=1), machine(gpu_ids=(2, 3)))
    assert plan.nodes[0].ranks[0].env["CUDA_VISIBLE_DEVICES"] == "2"


@pytest.mark.parametrize("pdsh, launcher, expected", [(True, None, "pdsh"), (False, None, "ssh"),
                                                      (True, "openmpi", "openmpi")])
def test_launcher_choice(pdsh, launcher, expected):
    plan = build_plan(HOSTS, LaunchOptions(script="t.py", launcher=launcher), machine(pdsh_available=pdsh))
    assert plan.launcher == expected


def test_single_remote_host_is_not_run_locally():
    # DeepSpeed runs a one-host hostfile on the launching machine, whatever the host is.
    plan = plan_for(exclude="nodeA")
    assert plan.launcher == "pdsh" and plan.nodes[0].host == "nodeB"


@pytest.mark.parametrize("options, error, message", [
    ({"module": True, "no_python": True}, UsageError, "cannot be used together"),
    ({"as_deepspeed": True, "no_python": True}, UsageError, "cannot be used together"),
    ({"include": "nodeA", "num_gpus": 1}, FilterError, "cannot be combined"),
    ({"launcher": "local"}, UsageError, "cannot start ranks on other hosts: nodeA, nodeB"),
    ({"launcher": "mvapich"}, UsageError, "unknown launcher"),
    ({"master_port": 70000}, UsageError, "is not a port"),
])
def test_option_errors(options, error, message):
    with pytest.raises(error, match=message):
        plan_for(**options)


def test_master_port_replacement():
    plan = with_master_port(plan_for(master_port=0), 4567)
    assert plan.master_port == 4567
    assert {r.env["MASTER_PORT"] for n in plan.nodes for r in n.ranks} == {"4567"}


def test_config_is_handed_to_ranks():
    env = plan_for(config="ds.json").nodes[0].ranks[0].env
    assert env["DSLAUNCH_CONFIG"] == "/work/ds.json"


def test_hosts_that_are_all_this_machine_run_locally_with_ranks_in_node_order():
    hosts = parse_hostfile("localhost slots=1\n127.0.0.1 slots=2\n", "h")
    plan = build_plan(hosts, LaunchOptions(script="t.py"), machine())
    assert plan.launcher == "local"
    assert [(n.node_rank, [r.rank for r in n.ranks]) for n in plan.nodes] == [(0, [0]), (1, [1, 2])]
    assert plan.nodes[1].ranks[1].env["NODE_RANK"] == "1"
