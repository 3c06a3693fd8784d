"""Sequence parallelism's autograd functions and layers on 2 gloo ranks against the unsplit computation.

Each rank sees the same full tensors (seeded) and checks its slice of the outputs and gradients:
the four sequence moves one by one, then a pre-norm MLP block (LayerNorm, column-parallel fc,
row-parallel proj with a bias, residual) split by ``apply_tensor_parallel(..., sequence_parallel=True)``,
whose replicated LayerNorm and bias gradients must come out whole on every rank; both again with
``dist.reduce_scatter`` missing (the all-reduce fallback).
"""
import json
import socket

import torch
import torch.distributed as dist
import pytest
import torch.multiprocessing as mp
from torch import nn

from launcher.zero.errors import ConfigError

from launcher.zero.parallel import sequence
from launcher.zero.parallel.sequence import (gather_sequence, gather_sequence_for_column, reduce_scatter_sequence,
                                             scatter_sequence)
from launcher.zero.parallel.tensor import RowParallelLinear, apply_tensor_parallel

BATCH, SEQ, WIDTH = 2, 6, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.norm = nn.LayerNorm(WIDTH)
        self.fc, self.proj = nn.Linear(WIDTH, 8), nn.Linear(8, WIDTH)
        with torch.no_grad():      # LayerNorm starts at 1 / 0: make its gradient depend on the values
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return x + self.proj(torch.tanh(self.fc(self.norm(x))))


def _max_error(pairs) -> float:
    return max((got - want).abs().max().item() for got, want in pairs)


def _functions(rank, group) -> dict:
    """The four moves against the unsplit tensors; returns the max abs error of each."""
    torch.manual_seed(0)
    full = torch.randn(BATCH, SEQ, WIDTH)
    weights = torch.randn(2, BATCH, SEQ, WIDTH)         # one per rank: per-rank partial losses
    mine = slice(rank * SEQ // 2, (rank + 1) * SEQ // 2)
    errors = {}

    x = full.clone().requires_grad_()
    out = scatter_sequence(x, group)
    (out * weights[rank][:, mine]).sum().backward()
    # the loss summed over ranks is sum_r (x[slice r] * w_r[slice r]): x's grad is each rank's slice
    expected = torch.cat([weights[r][:, r * SEQ // 2:(r + 1) * SEQ // 2] for r in range(2)], dim=1)
    errors["scatter_sequence"] = _max_error([(out, full[:, mine]), (x.grad, expected)])

    local = full[:, mine].clone().requires_grad_()
    out = gather_sequence(local, group)
    (out * weights[0]).sum().backward()                 # the same work on every rank
    errors["gather_sequence"] = _max_error([(out, full), (local.grad, weights[0][:, mine])])

    local = full[:, mine].clone().requires_grad_()
    out = gather_sequence_for_column(local, group)
    (out * weights[rank]).sum().backward()              # each rank a partial sum over its columns
    errors["gather_sequence_for_column"] = _max_error([(out, full), (local.grad, weights.sum(0)[:, mine])])

    partial = (full * (rank + 1)).requires_grad_()      # rank r's partial product
    out = reduce_scatter_sequence(partial, group)
    (out * weights[rank][:, mine]).sum().backward()
    errors["reduce_scatter_sequence"] = _max_error([(out, (full * 3)[:, mine]), (partial.grad, expected)])
    return errors


def _block(rank, group) -> dict:
    """The sequence-parallel block against the unsplit one: outputs, input grads and every parameter grad."""
    torch.manual_seed(1)
    full = torch.randn(BATCH, SEQ, WIDTH)
    upstream = torch.randn(BATCH, SEQ, WIDTH)
    mine = slice(rank * SEQ // 2, (rank + 1) * SEQ // 2)
    reference = Block()
    x_ref = full.clone().requires_grad_()
    out_ref = reference(x_ref)
    (out_ref * upstream).sum().backward()

    split = apply_tensor_parallel(Block(), {"norm": "norm", "fc": "colwise", "proj": "rowwise"}, group,
                                  sequence_parallel=True)
    x = full[:, mine].clone().requires_grad_()
    out = split(x)
    (out * upstream[:, mine]).sum().backward()
    pairs = [(out, out_ref[:, mine]), (x.grad, x_ref.grad[:, mine])]
    grads = dict(reference.named_parameters())
    for name, param in split.named_parameters():
        want = grads[name].grad
        if getattr(param, "tensor_model_parallel", False):
            want = want.chunk(2, dim=param.partition_dim)[rank]
        pairs.append((param.grad, want))
    marked = sorted(name for name, p in split.named_parameters() if getattr(p, "sequence_parallel", False))
    return {"block": _max_error(pairs), "marked": marked}


def _unsupported(*args, **kwargs):
    raise RuntimeError("ProcessGroupGloo does not support reduce_scatter")


def _rank(rank, port, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        result = {**_functions(rank, dist.group.WORLD), **_block(rank, dist.group.WORLD)}
        try:
            scatter_sequence(torch.zeros(BATCH, 5, WIDTH), dist.group.WORLD)
            result["indivisible refused"] = False
        except ConfigError as error:
            result["indivisible refused"] = "do not divide" in str(error) and "multiple of the tensor size" in error.hint
        # a backend without reduce_scatter (older gloo): the all-reduce fallback gives the same numbers
        fused = dist.reduce_scatter
        dist.reduce_scatter = _unsupported
        try:
            result.update({f"fallback {name}": error for name, error in _functions(rank, dist.group.WORLD).items()})
            result["fallback block"] = _block(rank, dist.group.WORLD)["block"]
            result["fallback remembered"] = sequence._NO_REDUCE_SCATTER == {"gloo"}
        finally:
            dist.reduce_scatter = fused
            sequence._NO_REDUCE_SCATTER.clear()
        with open(f"{out_dir}/rank_{rank}.json", "w") as handle:
            json.dump(result, handle)
    finally:
        dist.destroy_process_group()


def test_sequence_moves_and_a_sequence_parallel_block_match_the_unsplit_computation(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_rank, args=(port, str(tmp_path)), nprocs=2)
    for rank in range(2):
        result = json.loads((tmp_path / f"rank_{rank}.json").read_text())
        print(f"rank {rank} max abs errors:", {k: v for k, v in result.items() if isinstance(v, float)})
        assert result.pop("marked") == ["norm.bias", "norm.weight", "proj.bias"]
        assert result.pop("fallback remembered") is True
        assert result.pop("indivisible refused") is True
        for name, error in result.items():
            assert error < 1e-6, (rank, name, error)


def test_plan_mistakes_under_sequence_parallelism_are_config_errors_with_a_hint():
    with pytest.raises(ConfigError, match="'fc' is a Linear, style 'norm' takes") as caught:
        apply_tensor_parallel(Block(), {"fc": "norm"}, None, sequence_parallel=True)
    assert "layer norms" in caught.value.hint
    with pytest.raises(ConfigError, match="needs its input split by features"):
        RowParallelLinear.from_linear(nn.Linear(8, 4), None, input_is_parallel=False, sequence_parallel=True)
