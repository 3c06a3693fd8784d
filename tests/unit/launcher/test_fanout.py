"""Fan-out at scale: the fd limit is checked before a launch starts, pdsh fans out to every node."""
import pytest

from launcher.control.fanout import fds_needed, soft_limit_for
from launcher.control.runners import ControlEndpoint, pdsh
from launcher.errors import LaunchError
from launcher.planning.hostfile import parse_hostfile
from launcher.planning.plan import LaunchOptions, Machine, build_plan

END = ControlEndpoint("10.0.0.9", 4000, "tok")


def plan(nodes: int):
    text = "".join(f"w{i} slots=1\n" for i in range(nodes))
    m = Machine(python="/py", cwd="/w", environ={}, pdsh_available=True)
    return build_plan(parse_hostfile(text, "h"), LaunchOptions(script="t.py"), m)


def test_enough_soft_limit_is_kept():
    assert soft_limit_for(8, soft=1024, hard=4096) == 1024


def test_short_soft_limit_is_raised_to_what_the_job_needs():
    assert soft_limit_for(300, soft=1024, hard=1 << 20) == fds_needed(300)


def test_unlimited_is_left_alone():
    assert soft_limit_for(5000, soft=-1, hard=-1) == -1


def test_short_hard_limit_is_a_typed_error_naming_ulimit():
    with pytest.raises(LaunchError) as err:
        soft_limit_for(1000, soft=1024, hard=1024)
    assert "1000 nodes" in err.value.message and "ulimit -n" in err.value.message
    assert "ulimit -n" in err.value.hint and "pdsh" in err.value.hint


def test_pdsh_fan_out_covers_every_node():
    argv = pdsh.render(plan(1500), END)[0]
    assert argv[argv.index("-f") + 1] == "1500"
