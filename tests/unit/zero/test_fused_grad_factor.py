"""torch's fused Adam/AdamW takes the step's unscale-and-clip factor into its kernel
(optim/step_factor.py): no separate pass over the master grads, the same training as with that
pass, at every stage, with clipping active, with fp16 loss scaling and with bf16's factor kept on
the device. torch's fused AdamW runs on the CPU too, so this is tested here (one rank, gloo)."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from launcher import zero
from launcher.zero.optim.lamb import Lamb
from launcher.zero.optim.step_factor import factor_in_kernel, fuses_grad_factor

CLIP = 0.05          # the gradients' norm is ~1: every step clips
STEPS = 6
PRECISIONS = {
    "fp32": {},
    "fp16": {"fp16": {"enabled": True, "initial_scale_power": 8}},    # the factor includes 1 / 256
    "bf16": {"bf16": {"enabled": True, "check_grad_overflow": False}},  # the factor is a device tensor
}


class OwnStepAdamW(torch.optim.AdamW):
    """torch's fused AdamW as a subclass with a ``step`` of its own: the engine cannot know that
    this step reads ``grad_scale``, so it multiplies the master grads first (the separate pass)."""

    def step(self, closure=None):
        return super().step(closure)


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def build(stage: int, precision: str, optimizer_cls=torch.optim.AdamW):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    optimizer = optimizer_cls(model.parameters(), lr=0.01, weight_decay=0.1, fused=True)
    config = {"train_micro_batch_size_per_gpu": 8, "gradient_clipping": CLIP, **PRECISIONS[precision],
              "zero_allow_untested_optimizer": True,   # OwnStepAdamW
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 10}}
    engine, *_ = zero.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def train(engine, steps=STEPS):
    """Per step: the loss and the gradient norm; then the final fp32 weights."""
    generator = torch.Generator().manual_seed(1)
    dtype = next(engine.module.parameters()).dtype
    losses, norms = [], []
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=generator), torch.randn(8, 4, generator=generator)
        loss = torch.nn.functional.mse_loss(engine(x.to(dtype)).float(), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        norms.append(engine.get_global_grad_norm())
    weights = [master.detach().clone() for master in engine.strategy.master_tensors()]
    return losses, norms, weights


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_factor_in_the_kernel_trains_like_the_separate_pass(stage, precision):
    expected_losses, expected_norms, expected_weights = train(build(stage, precision, OwnStepAdamW))
    torch.distributed.destroy_process_group()
    engine = build(stage, precision)
    assert fuses_grad_factor(engine.basic_optimizer, engine.strategy.masters_on_device)
    losses, norms, weights = train(engine)
    assert min(expected_norms) > 10 * CLIP                      # clipping was active at every step
    assert losses == pytest.approx(expected_losses, rel=1e-6, abs=1e-7)
    assert norms == pytest.approx(expected_norms, rel=1e-6)
    for got, expected in zip(weights, expected_weights):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
    assert not hasattr(engine.basic_optimizer, "grad_scale")          # a later step by the user is not scaled


class InPlaceMultiplies(TorchDispatchMode):
    """Counts in-place multiplications of tensors bigger than a scalar (a pass over gradients)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mul_.Tensor, torch.ops.aten.mul_.Scalar) and args[0].numel() > 1:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_fused_adamw_step_makes_no_pass_over_the_master_grads(stage, precision):
    def multiplies_in_a_step(engine):
        train(engine, steps=1)                       # the optimizer state is built
        x = torch.randn(8, 16).to(next(engine.module.parameters()).dtype)
        engine.backward(engine(x).float().pow(2).mean())
        with InPlaceMultiplies() as counted:
            engine.step()
        return counted.count

    assert multiplies_in_a_step(build(stage, precision, OwnStepAdamW)) > 0   # the separate pass
    torch.distributed.destroy_process_group()
    assert multiplies_in_a_step(build(stage, precision)) == 0


def test_an_fp16_overflow_still_skips_the_step():
    engine = build(2, "fp16")
    train(engine, steps=1)
    before = [m.detach().clone() for m in engine.strategy.master_tensors()]
    steps_before = [s["step"].clone() for s in engine.basic_optimizer.state.values()]
    x = torch.randn(8, 16).half()
    engine.backward(engine(x).float().pow(2).mean() * float("inf"))
    engine.step()
    assert engine.skipped_steps == 1 and not engine.was_step_applied()
    for got, expected in zip(engine.strategy.master_tensors(), before):
        assert torch.equal(got, expected)
    assert [s["step"] for s in engine.basic_optimizer.state.values()] == steps_before


def parameters():
    return [torch.nn.Parameter(torch.randn(10))]


@pytest.mark.parametrize("optimizer, on_device, fused", [
    (lambda: torch.optim.AdamW(parameters(), fused=True), True, True),
    (lambda: torch.optim.Adam(parameters(), fused=True), True, True),
    (lambda: torch.optim.AdamW(parameters(), fused=True), False, False),    # offloaded masters
    (lambda: torch.optim.AdamW(parameters()), True, False),                 # foreach / for-loop
    (lambda: torch.optim.AdamW(parameters(), fused=False), True, False),
    (lambda: OwnStepAdamW(parameters(), fused=True), True, False),          # a step of its own
    (lambda: torch.optim.SGD(parameters(), lr=0.1, fused=True), True, False),
    (lambda: Lamb(parameters()), True, False),
])
def test_which_optimizers_take_the_factor(optimizer, on_device, fused):
    assert fuses_grad_factor(optimizer(), on_device) is fused


@pytest.mark.parametrize("factor", [0.25, 1.0, torch.tensor(0.25, dtype=torch.float64), 0.0])
def test_the_kernel_leaves_the_grads_multiplied_as_the_separate_pass_does(factor):
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(1000))
    grad = torch.randn(1000)
    grad[3] = float("inf")      # inf times 0 and inf over inf are both NaN
    param.grad = grad.clone()
    optimizer = torch.optim.AdamW([param], fused=True)
    with factor_in_kernel(optimizer, factor, torch.device("cpu")):
        optimizer.step()
    torch.testing.assert_close(param.grad, grad * float(factor), rtol=2e-7, atol=0, equal_nan=True)
    assert not hasattr(optimizer, "grad_scale")
