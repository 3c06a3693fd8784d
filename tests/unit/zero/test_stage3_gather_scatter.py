"""Stage 3's collectives fall back once per backend when the fused form is missing, with the same
numbers (a one-rank gloo group in this process; the multi-rank paths run in tests/dist)."""
import socket

import pytest
import torch
import torch.distributed as dist

from launcher.zero.stages.stage3 import gather_scatter


@pytest.fixture
def group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    gather_scatter._UNSUPPORTED.clear()
    yield dist.group.WORLD
    gather_scatter._UNSUPPORTED.clear()
    dist.destroy_process_group()


def unsupported(calls):
    def fused(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("this backend does not support the fused collective")
    return fused


@pytest.mark.parametrize("name, run", [
    ("all_gather_single", lambda out, g: gather_scatter.all_gather_shard(out, torch.arange(4.0), g, async_op=False)),
    ("reduce_scatter_single", lambda out, g: gather_scatter.reduce_scatter_shard(out, torch.arange(4.0), g, async_op=False)),
])
def test_a_missing_fused_collective_falls_back_once_with_the_same_result(group, monkeypatch, name, run):
    calls = []
    monkeypatch.setattr(dist, name, unsupported(calls))
    for _ in range(3):
        out = torch.zeros(4)
        assert run(out, group) is None
        assert torch.equal(out, torch.arange(4.0))
    assert calls == [1]  # tried once, then remembered for this backend


def test_other_errors_of_the_fused_collective_are_not_swallowed(group, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("connection reset by peer")
    monkeypatch.setattr(dist, "all_gather_single", broken)
    with pytest.raises(RuntimeError, match="connection reset"):
        gather_scatter.all_gather_shard(torch.zeros(4), torch.zeros(4), group, async_op=False)


def test_the_fused_collective_returns_its_work_handle(group):
    out = torch.zeros(4)
    work = gather_scatter.all_gather_shard(out, torch.arange(4.0), group, async_op=True)
    work.wait()
    assert torch.equal(out, torch.arange(4.0))
