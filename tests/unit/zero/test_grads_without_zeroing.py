"""Stages 0-2 drop the zeroing pass over the gradient buffers at each step (issue 39): a step's
first gradient of a range is copied over what the last step left, later ones added. So a
parameter that gets no gradient in a step (a branch not taken) must still read zero there and
train as torch's AdamW trains it, with and without gradient accumulation (one rank, gloo, CPU)."""
import copy

import pytest
import torch

from launcher import zero
from launcher.zero.utils import safe_get_full_grad


class TwoHeads(torch.nn.Module):
    """A trunk and two heads; head ``b`` is used only when asked (a branch not taken)."""

    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Linear(8, 32)
        self.a = torch.nn.Linear(32, 4)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x, use_b: bool):
        h = torch.tanh(self.trunk(x))
        return self.a(h) + (self.b(h) if use_b else 0.0)


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def batches(count):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 8, generator=generator), torch.randn(4, 4, generator=generator), i % 3 == 0)
            for i in range(count)]


def reference(model, data, accumulation):
    """torch's fused AdamW over the same micro-batches (loss divided by the accumulation steps), a
    parameter without a gradient stepped with a zero one (as the engine, and DeepSpeed, step it)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    for index, (x, y, use_b) in enumerate(data):
        (torch.nn.functional.mse_loss(model(x, use_b), y) / accumulation).backward()
        if (index + 1) % accumulation == 0:
            for param in model.parameters():
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("accumulation", [1, 2])
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_a_branch_not_taken_trains_as_torch_adamw_trains_it(stage, accumulation):
    torch.manual_seed(0)
    model = TwoHeads()
    expected = reference(copy.deepcopy(model), batches(12), accumulation)
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": accumulation, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": stage},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1, "fused": True}}}
    engine, *_ = zero.initialize(model=model, config=config)
    for x, y, use_b in batches(12):
        engine.backward(torch.nn.functional.mse_loss(engine(x, use_b), y))
        if not use_b and engine.is_gradient_accumulation_boundary() and accumulation == 1:
            assert torch.count_nonzero(safe_get_full_grad(engine.module.b.weight)) == 0
        engine.step()
    for got, want in zip(engine.module.parameters(), expected):
        torch.testing.assert_close(got.detach(), want, rtol=1e-6, atol=1e-7)
