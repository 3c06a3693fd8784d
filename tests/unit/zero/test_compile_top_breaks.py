"""Stage 3 compiled with its top (compiling.py, scope "blocks_and_top") on one rank: the graph
breaks are the block calls, where the strategy gathers, counted once when traced and not again
per step; nothing recompiles; the loss runs in a compiled graph; ``destroy`` gives back every
forward and the parameter names are those of the module. (2-rank parity, HF models:
tests/dist/test_compile_top_stage3.py.)"""
import pytest
import torch
import torch.nn.functional as F

from launcher import zero
from launcher.zero.engine.compiling import compile_stats


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.fc = torch.nn.LayerNorm(16), torch.nn.Linear(16, 16)

    def forward(self, x):
        return x + torch.tanh(self.fc(self.norm(x)))


class Body(torch.nn.Module):
    """The blocks' loop one level down, as in Hugging Face models (LlamaModel under LlamaForCausalLM)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(32, 16)
        self.layers = torch.nn.ModuleList(Block() for _ in range(3))

    def forward(self, idx):
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x)
        return x


class LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head = Body(), torch.nn.Linear(16, 32, bias=False)

    def forward(self, idx, targets):
        logits = self.head(self.body(idx)).float()
        return F.cross_entropy(logits.view(-1, 32), targets.reshape(-1))


def cfg():
    return {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3,
                                                                       "stage3_param_persistence_threshold": 10},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "steps_per_print": 10**9}


def steps(engine, count, gen):
    for _ in range(count):
        tokens = torch.randint(0, 32, (2, 9), generator=gen)
        loss = engine(tokens[:, :-1], tokens[:, 1:])
        engine.backward(loss)
        engine.step()


def test_graph_breaks_are_the_block_calls_counted_once_and_the_loss_is_compiled():
    torch.manual_seed(0)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = LM()
    names = [name for name, _ in model.named_parameters()]
    seen = []

    def backend(gm, example_inputs):
        seen.append(gm.code)
        return gm.forward

    engine, _, _, _ = zero.initialize(model=model, config=cfg())
    engine.compile(backend=backend)
    gen = torch.Generator().manual_seed(1)
    steps(engine, 2, gen)
    first = compile_stats()
    steps(engine, 4, gen)
    later = compile_stats()
    assert first == later, (first, later)
    assert later["unique_graphs"] > 0 and later["recompiles"] == 0, later
    # the body's loop holds the block calls, so dynamo skips the body's frame (its lines run
    # eagerly) and breaks the top's graph at the body's call: the only break, a gathering hook
    assert later["graph_breaks"] >= 1 and all("ParamCoordinator._before_module" in reason
                                              for reason in later["graph_break_reasons"]), later
    assert any("cross_entropy" in code for code in seen)   # the loss ran in a compiled graph
    held = sum(p.numel() for p in model.parameters() if getattr(p, "ds_state", None) is not None)
    assert held == 0   # every partitioned parameter released after the step, the top's too
    assert [name for name, _ in model.named_parameters()] == names
    assert set(engine.module_state_dict()) == set(model.state_dict())
    engine.destroy()
    assert not any("forward" in m.__dict__ for m in model.modules())
