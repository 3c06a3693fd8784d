"""The step's gradient norm (stages/base.py ``square_sum``) reads each gradient once: as close to a
float64 sum as the clip factor needs, without a float64 copy of the gradient (the step's norm
moved 20 bytes an element through such copies: 8 ms of an H100 step on a 1.24B model)."""
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from launcher.zero.stages.base import NORM_ROW, square_sum

NUMEL = (1 << 20) + 37       # not a whole number of rows: the tail counts too


def gradient(kind: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(NUMEL, generator=generator)
    if kind == "spread":     # magnitudes over ~8 decades, as gradients of different layers are
        values = values * torch.exp(3 * torch.randn(NUMEL, generator=generator))
    return values


@pytest.mark.parametrize("kind", ["normal", "spread"])
def test_the_square_sum_is_a_float64_sum_to_1e_7(kind):
    grad = gradient(kind)
    expected = grad.double().square().sum()
    got = square_sum(grad)
    assert got.dtype == torch.float64 and got.dim() == 0
    assert abs(float(got) / float(expected) - 1) < 1e-7


def test_a_short_tensor_a_strided_one_and_a_16_bit_one():
    short = torch.randn(NORM_ROW // 3)
    assert float(square_sum(short)) == pytest.approx(float(short.double().square().sum()), rel=2e-7)
    strided = torch.randn(3000, 2)[:, 0]
    assert float(square_sum(strided)) == pytest.approx(float(strided.double().square().sum()), rel=2e-7)
    half = (torch.randn(4 * NORM_ROW) * 300).to(torch.float16)       # its squares overflow float16
    assert float(square_sum(half)) == pytest.approx(float(half.double().square().sum()), rel=2e-7)


def test_a_non_finite_gradient_makes_it_non_finite():
    for bad in (float("inf"), float("nan")):
        grad = torch.randn(3 * NORM_ROW + 5)
        grad[-2] = bad
        assert not torch.isfinite(square_sum(grad))


def largest_allocation(fn) -> int:
    """The largest single allocation ``fn`` makes, in bytes, kernels' own temporaries included."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((event.self_cpu_memory_usage for event in prof.events()), default=0)


def test_no_float64_copy_of_the_gradient_is_made():
    grad = gradient("normal")
    # a float64 copy of even a slice would be megabytes; the row norms are NUMEL / 256 bytes
    assert largest_allocation(lambda: square_sum(grad)) < grad.numel()
    # the check sees copies made inside a kernel: torch's float64 norm of float32 copies first
    # (torch 2.x; were it ever to cast as it reads, this line goes, and square_sum could use it)
    assert largest_allocation(lambda: torch.linalg.vector_norm(grad, dtype=torch.float64)) >= 8 * grad.numel()
