"""1-bit Adam's pure parts (compression arithmetic) and the optimizer in one process."""

import copy

import pytest
import torch

from launcher.errors import ConfigError
from launcher.zero.optim.onebit import OneBitAdam, OnebitAdam
from launcher.zero.optim.onebit.compression import (compress, decompress, pack_signs, padded_numel,
                                              simulate_compressed_allreduce, unpack_signs)


@pytest.mark.parametrize("numel,world_size,expected", [
    (1, 1, 8), (8, 1, 8), (9, 1, 16), (1, 2, 16), (16, 2, 16), (17, 2, 32), (100, 3, 120), (0, 4, 32),
])
def test_padded_numel_splits_into_whole_bytes_per_rank(numel, world_size, expected):
    assert padded_numel(numel, world_size) == expected


def test_signs_round_trip_and_zero_counts_as_plus_one():
    x = torch.tensor([0.5, -1.0, 0.0, -0.0, 3.0, -2.0, 1e-9, -1e-9, -5, 5, 0, 0, -1, -1, -1, 1])
    packed = pack_signs(x)
    assert packed.dtype == torch.uint8 and packed.numel() == 2
    assert unpack_signs(packed).tolist() == [1, -1, 1, 1, 1, -1, 1, -1, -1, 1, 1, 1, -1, -1, -1, 1]


def test_compress_keeps_what_it_drops_in_the_error():
    torch.manual_seed(0)
    x, error = torch.randn(64), torch.randn(64) * 0.1
    before = x + error
    packed, scale = compress(x, error)
    torch.testing.assert_close(decompress(packed, scale) + error, before)
    torch.testing.assert_close(scale, before.norm() / 8)


def test_error_feedback_makes_the_running_sum_track_the_true_sum():
    # With feedback the sum of compressed averages stays within one step's error of the
    # true sum; without it the bias would grow with the number of rounds.
    torch.manual_seed(0)
    world_size, n, rounds = 2, 256, 50
    worker_errors = [torch.zeros(n) for _ in range(world_size)]
    server_errors = [torch.zeros(n // world_size) for _ in range(world_size)]
    true_sum, compressed_sum = torch.zeros(n), torch.zeros(n)
    for _ in range(rounds):
        buffers = [torch.randn(n) + 0.3 for _ in range(world_size)]
        true_sum += sum(buffers) / world_size
        compressed_sum += simulate_compressed_allreduce(buffers, worker_errors, server_errors)
    residual = compressed_sum - true_sum
    assert residual.abs().mean() < 0.1 * true_sum.abs().mean()


@pytest.mark.parametrize("kwargs,needle", [
    ({"lr": -1.0}, "lr"), ({"betas": (0.9, 1.0)}, "betas"), ({"eps": 0.0}, "eps"),
    ({"weight_decay": -0.1}, "weight_decay"), ({"freeze_step": -1}, "freeze_step"),
    ({"freeze_step": 2.5}, "freeze_step"), ({"comm_backend_name": "mpi"}, "not supported"),
    ({"comm_backend_name": "ucc"}, "comm_backend_name"), ({"amsgrad": True}, "amsgrad"),
])
def test_bad_parameters_raise_config_errors(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        OnebitAdam([torch.nn.Parameter(torch.zeros(2))], comm_backend_name=kwargs.pop("comm_backend_name", "gloo"),
                   **kwargs)


def test_tells_the_engine_it_averages_gradients_itself():
    assert OnebitAdam.handles_gradient_communication is True
    assert OneBitAdam is OnebitAdam


def test_warmup_is_adam_without_bias_correction_and_with_weight_decay_in_the_update():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = OnebitAdam([p], lr=0.1, weight_decay=0.5, freeze_step=10, comm_backend_name="gloo")
    grads = [torch.tensor([0.5, 1.0]), torch.tensor([-1.0, 2.0])]
    m = v = torch.zeros(2)
    expected = p.detach().clone()
    for g in grads:
        p.grad = g.clone()
        opt.step()
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        expected = expected - 0.1 * (m / (v.sqrt() + 1e-8) + 0.5 * expected)
    torch.testing.assert_close(p.detach(), expected)
    assert opt.last_step_comm["phase"] == "warmup" and not opt.compressing


def test_after_freeze_variance_is_frozen_and_momentum_compressed():
    p = torch.nn.Parameter(torch.zeros(5))
    opt = OnebitAdam([p], lr=0.1, freeze_step=1, comm_backend_name="gloo")
    p.grad = torch.tensor([1.0, -1.0, 2.0, 0.5, -0.5])
    opt.step()
    v_frozen = opt.state[p]["exp_avg_sq"].clone()
    p.grad = torch.tensor([3.0, 3.0, -3.0, 3.0, 3.0])
    opt.step()
    assert opt.last_step_comm["phase"] == "compressed"
    torch.testing.assert_close(opt.state[p]["exp_avg_sq"], v_frozen)
    # one rank: the momentum is replaced by its 1-bit image, +-scale
    m = opt.state[p]["exp_avg"]
    assert m.abs().unique().numel() == 1


def test_state_dict_round_trip_carries_step_and_error_buffers():
    p = torch.nn.Parameter(torch.ones(10))
    opt = OnebitAdam([p], freeze_step=1, comm_backend_name="gloo")
    for g in (1.0, -2.0, 0.5):
        p.grad = torch.full((10,), g) * torch.arange(10.0)
        opt.step()
    state = copy.deepcopy(opt.state_dict())  # as if saved to a file
    q = torch.nn.Parameter(p.detach().clone())
    opt2 = OnebitAdam([q], freeze_step=1, comm_backend_name="gloo")
    opt2.load_state_dict(state)
    assert opt2.global_step == 3 and opt2.compressing
    for o in (opt, opt2):
        o.param_groups[0]["params"][0].grad = torch.linspace(-1, 1, 10)
        o.step()
    torch.testing.assert_close(q.detach(), p.detach(), rtol=0, atol=0)
