"""Stage 3: a parameter read at the model's top level and saved by a custom autograd Function
comes back in backward as the parameter itself, with its attributes and gathered (TRL's fused LM
head reads ``ds_status`` there), and training matches the same model without ZeRO."""
import pytest
import torch
import torch.nn as nn

from launcher import zero
from launcher.zero.stages.stage3.params import AVAILABLE


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class HeadFunction(torch.autograd.Function):
    """``hidden @ weight.T``, saving the weight; backward records what it got back."""
    seen = []

    @staticmethod
    def forward(ctx, hidden, weight):
        ctx.save_for_backward(hidden, weight)
        return hidden @ weight.t()

    @staticmethod
    def backward(ctx, grad):
        hidden, weight = ctx.saved_tensors
        HeadFunction.seen.append((weight, getattr(weight, "ds_status", None), tuple(weight.shape)))
        return grad @ weight, grad.t() @ hidden


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 3, bias=False)   # never called: its weight is taken at the top level

    def forward(self, x):
        return HeadFunction.apply(torch.tanh(self.body(x)), self.head.weight)


def losses(stage, steps=3):
    torch.manual_seed(0)
    model = Net()
    engine, _, _, _ = zero.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}})
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    out = []
    for _ in range(steps):
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        out.append(loss.item())
    weight = model.head.weight
    engine.destroy()
    return out, weight


def test_custom_function_gets_the_parameter_itself_in_backward_at_stage3():
    HeadFunction.seen.clear()
    stage3, weight = losses(3)
    assert [seen[0] is weight for seen in HeadFunction.seen] == [True] * 3
    assert {(seen[1], seen[2]) for seen in HeadFunction.seen} == {(AVAILABLE, (3, 8))}
    reference, _ = losses(0)
    assert stage3 == pytest.approx(reference, abs=1e-6)
