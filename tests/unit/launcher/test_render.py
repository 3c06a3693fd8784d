"""Golden commands of every runner: what a launch would run, exactly."""
import pytest

from launcher.errors import UsageError
from launcher.planning.hostfile import parse_hostfile
from launcher.planning.plan import LaunchOptions, Machine, build_plan
from launcher.control.runners import ControlEndpoint, get_runner
from launcher.control.runners import pdsh, openmpi, slurm
from launcher.node.agent import resolve_node_rank

END = ControlEndpoint("10.0.0.9", 4000, "tok")
AGENT = "/py -u -m launcher.agent --connect 10.0.0.9:4000 --secret stdin --node-rank"   # ssh
TICKET_AGENT = "/py -u -m launcher.agent --connect 10.0.0.9:4000 --ticket tok --node-rank"   # pdsh
ENV_AGENT = "/py -u -m launcher.agent --connect 10.0.0.9:4000 --secret env:DSLAUNCH_AGENT_SECRET --node-rank"


def plan(text="w0 slots=2\nme@w1:2200 slots=2\n", **kw):
    m = Machine(python="/py", cwd="/work dir", environ={}, pdsh_available=True)
    return build_plan(parse_hostfile(text, "h"), LaunchOptions(script="t.py", **kw), m)


def test_ssh_golden():
    commands = get_runner("ssh").render(plan(), END)
    assert commands[0] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "w0",
                           f"cd '/work dir' && exec {AGENT} 0"]
    assert commands[1] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-p", "2200", "me@w1",
                           f"cd '/work dir' && exec {AGENT} 1"]


def test_ssh_port_option_applies_to_every_host():
    commands = get_runner("ssh").render(plan("w0 slots=1\nw1 slots=1\n", ssh_port=2222), END)
    assert all(c[5:7] == ["-p", "2222"] for c in commands)


def test_pdsh_golden_and_args_append_is_kept():
    p = plan("w0 slots=2\nw1 slots=2\n", ssh_port=2222, launcher_args="-u 30")
    assert pdsh.render(p, END)[0] == ["pdsh", "-S", "-R", "ssh", "-f", "1024", "-w", "w0,w1", "-u", "30",
                                      f"cd '/work dir' && exec {TICKET_AGENT} %n"]
    env = pdsh.runner_env(p, {"PDSH_SSH_ARGS_APPEND": "-vv"})
    assert env["PDSH_SSH_ARGS_APPEND"] == "-vv -o BatchMode=yes -p 2222"
    assert env["PDSH_RCMD_TYPE"] == "ssh"


def test_pdsh_refuses_per_host_ports():
    with pytest.raises(UsageError, match="different ssh port per host"):
        pdsh.render(plan("w0:22 slots=1\nw1:2200 slots=1\n"), END)


def test_openmpi_golden_honours_include():
    p = plan("w0 slots=2\nw1 slots=2\nw2 slots=2\n", include="w0@w2:1", launcher_args="--mca btl tcp,self")
    assert openmpi.command(p, END, as_root=False) == [
        "mpirun", "-np", "2", "-H", "w0:1,w2:1", "--bind-to", "none", "--wdir", "/work dir",
        "--mca", "plm_rsh_args", "-o BatchMode=yes", "-x", "DSLAUNCH_AGENT_SECRET", "--mca", "btl", "tcp,self",
        *ENV_AGENT.split(), "env:OMPI_COMM_WORLD_RANK"]
    assert openmpi.command(p, END, as_root=True)[1] == "--allow-run-as-root"
    assert [len(n.ranks) for n in p.nodes] == [2, 1]


def test_slurm_golden():
    p = plan("gn01 slots=4\ngn02 slots=4\n")
    assert slurm.render(p, END)[0] == [
        "srun", "--nodes", "2", "--ntasks", "2", "--ntasks-per-node", "1", "--nodelist", "gn01,gn02",
        "--chdir", "/work dir", *ENV_AGENT.split(), "env:SLURM_NODEID"]


@pytest.mark.parametrize("args, ok", [
    ("--export=ALL,FOO=1", True), ("--export=NONE,DSLAUNCH_AGENT_SECRET", True), ("--export NONE", False),
    ("--export=NONE", False), ("--export=PATH,HOME", False), ("--mpi=pmix", True),
])
def test_slurm_export_must_keep_the_agents_key(args, ok):
    p = plan("gn01 slots=1\ngn02 slots=1\n", launcher_args=args)
    if ok:
        assert "env:DSLAUNCH_AGENT_SECRET" in slurm.render(p, END)[0]
    else:
        with pytest.raises(UsageError, match="keep the agents' key"):
            slurm.render(p, END)


@pytest.mark.parametrize("text, hosts", [
    ("gn[01-03,7]", ["gn01", "gn02", "gn03", "gn7"]),
    ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
    ("gnode[10,20]", ["gnode10", "gnode20"]),
    ("x[1-2]-ib", ["x1-ib", "x2-ib"]),
    ("solo", ["solo"]),
])
def test_slurm_hostlist(text, hosts):
    assert slurm.expand_hostlist(text) == hosts


@pytest.mark.parametrize("environ, slots", [
    ({"SLURM_GPUS_ON_NODE": "8"}, [8, 8]),
    ({"SLURM_TASKS_PER_NODE": "3,1", "SLURM_NTASKS": "4"}, [3, 1]),
    ({"SLURM_TASKS_PER_NODE": "2(x2)"}, [2, 2]),
    ({"SLURM_NTASKS_PER_NODE": "2"}, [2, 2]),
    ({"SLURM_TASKS_PER_NODE": "junk", "SLURM_NTASKS_PER_NODE": "3"}, [3, 3]),
    ({}, [1, 1]),
])
def test_slurm_slots(environ, slots):
    assert slurm.allocation_slots(environ, 2) == slots


def test_slurm_tasks_per_node():
    assert slurm.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert slurm.expand_tasks_per_node("") == []


def test_local_renders_no_node_command():
    p = build_plan(None, LaunchOptions(script="t.py", num_gpus=2), Machine(python="/py", cwd="/w", environ={}))
    assert get_runner("local").render(p, END) == [[]]


@pytest.mark.parametrize("value, environ, expected", [
    ("3", {}, 3), ("env:OMPI_COMM_WORLD_RANK", {"OMPI_COMM_WORLD_RANK": "1"}, 1),
    ("env:SLURM_NODEID", {"SLURM_NODEID": "0"}, 0),
])
def test_agent_node_rank(value, environ, expected):
    assert resolve_node_rank(value, environ) == expected


def test_agent_node_rank_missing_var():
    with pytest.raises(SystemExit, match="SLURM_NODEID is not set"):
        resolve_node_rank("env:SLURM_NODEID", {})
