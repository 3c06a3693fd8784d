"""DeepSpeed 0.19.8 calls that failed here (issue 41 item 2), each as DeepSpeed answers it.

One-rank engines in this process; what needs two ranks (no_sync's reduction, a stage-3 parameter
returned to another module on real shards) is in tests/dist/test_deepspeed_calls_ranks.py. What
DeepSpeed does was read in its code and run on its CPU accelerator; the facts are in the docstrings.
"""
import copy

import pytest
import torch

from launcher import zero
from launcher.zero.errors import ConfigError


@pytest.fixture(autouse=True)
def no_process_group_left():
    """Engines here start a one-rank group in the pytest process; other tests start their own."""
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class Tagged(torch.nn.Module):
    """A model with a method and an attribute of its own, as scripts reach them through the engine."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)
        self.label_names = ["labels"]

    def forward(self, x):
        return self.lin(x)

    def count_to(self, n):
        return list(range(n))


def config(stage, optimizer=True, **extra):
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0, "zero_optimization": {"stage": stage}}
    if optimizer:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 0.1}}
    return {**cfg, **extra}


# ---- checkpoint.tag_validation ------------------------------------------------------------------
@pytest.mark.parametrize("given, mode", [("FAIL", "Fail"), ("fail", "Fail"), ("Warn", "Warn"), ("wArN", "Warn"),
                                         ("IGNORE", "Ignore")])
def test_tag_validation_is_read_in_any_case(given, mode):
    """DeepSpeed upper-cases the value before checking it (runtime/config.py)."""
    from launcher.zero.config.load import load_config

    loaded = load_config({"train_batch_size": 1, "checkpoint": {"tag_validation": given}})
    assert loaded.checkpoint.tag_validation == mode


def test_an_unknown_tag_validation_names_the_key_and_the_modes():
    from launcher.zero.config.load import load_config

    with pytest.raises(ConfigError, match="checkpoint.tag_validation: 'Never'") as caught:
        load_config({"train_batch_size": 1, "checkpoint": {"tag_validation": "Never"}})
    assert "Warn, Ignore, Fail" in caught.value.hint


# ---- pipelines: eval_batch and train_batch without loss_fn; pipeline.use_reentrant ------------
def pipeline(loss_fn, **pipe_config):
    from launcher.zero.pipe import LayerSpec, PipelineModule

    torch.manual_seed(0)
    module = PipelineModule([LayerSpec(torch.nn.Linear, 3, 2)], num_stages=1, loss_fn=loss_fn)
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 0.1}}}
    if pipe_config:
        cfg["pipeline"] = pipe_config
    engine, *_ = zero.initialize(model=module, config=cfg)
    return engine


def batches(count=2):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(2, 3, generator=generator), torch.randn(2, 2, generator=generator)) for _ in range(count)]


def test_eval_batch_without_loss_fn_returns_the_mean_output_as_deepspeed():
    """DeepSpeed: without ``loss_fn`` the last stage's output is what is averaged over the
    micro-batches (and the data ranks) and returned, as float32; ``return_logits`` adds the last
    micro-batch's output."""
    engine = pipeline(None)
    data = batches()
    with torch.no_grad():
        outputs = [engine.module(x) for x, _ in data]
    mean = engine.eval_batch(iter(data))
    assert mean.dtype == torch.float32 and torch.allclose(mean, (outputs[0] + outputs[1]) / 2)
    mean_again, logits = engine.eval_batch(iter(data), return_logits=True)
    assert torch.allclose(mean_again, mean) and torch.allclose(logits, outputs[1])


def test_eval_batch_with_a_loss_fn_can_skip_the_loss_and_return_logits():
    engine = pipeline(torch.nn.functional.mse_loss)
    data = batches()
    with torch.no_grad():
        outputs = [engine.module(x) for x, _ in data]
        losses = [torch.nn.functional.mse_loss(out, y) for out, (_, y) in zip(outputs, data)]
    assert torch.allclose(engine.eval_batch(iter(data)), (losses[0] + losses[1]) / 2)
    assert torch.allclose(engine.eval_batch(iter(data), compute_loss=False), (outputs[0] + outputs[1]) / 2)
    loss, logits = engine.eval_batch(iter(data), return_logits=True)
    assert torch.allclose(loss, (losses[0] + losses[1]) / 2) and torch.allclose(logits, outputs[1])
    per_micro_batch = engine.eval_batch(iter(data), reduce_output=None, bcast_loss=False)
    assert [float(v) for v in per_micro_batch] == pytest.approx([float(v) for v in losses])


def test_train_batch_without_loss_fn_trains_on_the_models_own_loss():
    """DeepSpeed: 'Some models just return loss from forward()': the output is the loss."""
    from launcher.zero.pipe import LayerSpec, PipelineModule

    class MeanSquare(torch.nn.Module):
        def forward(self, x):
            return x.pow(2).mean()

    torch.manual_seed(0)
    module = PipelineModule([LayerSpec(torch.nn.Linear, 3, 2), MeanSquare()], num_stages=1, loss_fn=None)
    plain = copy.deepcopy(module)
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 0.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 0.1}}}
    engine, *_ = zero.initialize(model=module, config=cfg)
    data = batches(2)
    loss = engine.train_batch(iter(data))
    with torch.no_grad():
        expected = (plain(data[0][0]) + plain(data[1][0])) / 2
    assert torch.allclose(loss, expected)


@pytest.mark.parametrize("value", [True, False])
def test_pipeline_use_reentrant_is_accepted(value):
    """DeepSpeed picks reentrant or non-reentrant activation checkpointing with it; both recompute
    the same gradients, and this engine always runs the non-reentrant one."""
    engine = pipeline(torch.nn.functional.mse_loss, use_reentrant=value, activation_checkpoint_interval=1)
    first = float(engine.train_batch(iter(batches())))
    assert first == pytest.approx(float(pipeline(torch.nn.functional.mse_loss).train_batch(iter(batches()))))


def test_pipeline_use_reentrant_must_be_true_or_false():
    with pytest.raises(ConfigError, match="pipeline.use_reentrant: expected true or false, got 'yes'"):
        pipeline(torch.nn.functional.mse_loss, use_reentrant="yes")


# ---- initialize without an optimizer (an evaluation or reference model, as TRL builds) ----------
# tests/unit/zero/test_initialize_without_optimizer.py has the forward at stages 0 and 3 and the refusal
# at stages 1-2; these are what DeepSpeed does beside it.
@pytest.mark.parametrize("stage", [0, 3])
def test_an_engine_without_an_optimizer_has_no_scheduler_even_with_a_scheduler_section(stage):
    """DeepSpeed configures the scheduler only with an optimizer (engine.py: has_optimizer)."""
    cfg = config(stage, optimizer=False, scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 2}})
    engine, optimizer, _, scheduler = zero.initialize(model=Tagged(), config=cfg)
    assert scheduler is None and engine.lr_scheduler is None


def test_at_stage_0_it_refuses_backward_and_step_and_has_no_lr_as_deepspeed():
    """DeepSpeed 0.19.8 at stage 0 in fp32: the optimizer is None, ``get_lr()`` is ``[]`` and both
    ``backward`` and ``step`` assert 'must provide optimizer during init in order to use ...'; here a
    typed error that is an AssertionError too."""
    engine, optimizer, *_ = zero.initialize(model=Tagged(), config=config(0, optimizer=False))
    assert optimizer is None and engine.optimizer is None and engine.get_lr() == []
    loss = engine(torch.randn(2, 4)).sum()
    with pytest.raises(AssertionError, match="without an optimizer") as caught:
        engine.backward(loss)
    assert "optimizer" in caught.value.hint
    with pytest.raises(AssertionError, match="engine.step.*without an optimizer"):
        engine.step()


# ---- the wrapped model's attributes through the engine ----------------------------------------
def test_the_models_methods_and_attributes_are_reached_through_the_engine():
    """DeepSpeedEngine.__getattr__ falls through to the module; a name neither has is an AttributeError."""
    engine, *_ = zero.initialize(model=Tagged(), config=config(0))
    assert engine.count_to(3) == [0, 1, 2] and engine.label_names == ["labels"]
    assert hasattr(engine, "count_to") and not hasattr(engine, "nothing_here")
    with pytest.raises(AttributeError, match="object has no attribute 'nothing_here'"):
        engine.nothing_here


# ---- no_sync ------------------------------------------------------------------------------------
def square_loss(engine, x):
    return engine(x).pow(2).mean()


@pytest.mark.parametrize("stage", [0, 1])
def test_no_sync_accumulates_and_the_next_boundary_applies_the_sum(stage):
    """Stages 0-1: inside ``no_sync`` a backward keeps its gradient local; the backward after it
    adds its own and the step applies both (DeepSpeed divides each loss by GAS, here 1)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    plain = copy.deepcopy(model)
    engine, *_ = zero.initialize(model=model, config=config(stage))
    reference = torch.optim.AdamW(plain.parameters(), lr=0.1, weight_decay=0.0)
    data = torch.randn(3, 2, 2, 4, generator=torch.Generator().manual_seed(1))
    for step in range(3):
        with engine.no_sync():
            engine.backward(square_loss(engine, data[step, 0]))
        engine.backward(square_loss(engine, data[step, 1]))
        engine.step()
        (plain(data[step, 0]).pow(2).mean() + plain(data[step, 1]).pow(2).mean()).backward()
        reference.step()
        reference.zero_grad()
    for ours, theirs in zip(engine.module.parameters(), plain.parameters()):
        assert torch.allclose(ours, theirs, atol=1e-6)


def test_no_sync_refuses_a_step_inside_and_reentry_with_deepspeeds_messages():
    engine, *_ = zero.initialize(model=Tagged(), config=config(0))
    with engine.no_sync():
        engine.backward(engine(torch.randn(2, 4)).sum())
        with pytest.raises(AssertionError, match="illegal to call engine.step.. inside no_sync"):
            engine.step()
        with pytest.raises(AssertionError, match="no_sync context manager reentry is unsupported"):
            with engine.no_sync():
                pass
    assert engine.global_steps == 0
    engine.step()
    assert engine.global_steps == 1


@pytest.mark.parametrize("stage", [2, 3])
def test_no_sync_at_stages_2_and_3_fails_on_entering_as_deepspeeds(stage):
    """DeepSpeed 0.19.8: ``engine.no_sync()`` returns the context manager; entering it asserts
    'no_sync context manager is incompatible with gradient partitioning logic of ZeRO stage N'."""
    engine, *_ = zero.initialize(model=Tagged(), config=config(stage))
    context = engine.no_sync()
    with pytest.raises(AssertionError, match=f"incompatible with gradient partitioning logic of ZeRO stage {stage}"):
        with context:
            pass


# ---- stage 3: a parameter one module returns for another to use --------------------------------
class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(16, 8))

    def forward(self, ids):
        return torch.nn.functional.embedding(ids, self.weight), self.weight


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Linear(8, 8)

    def forward(self, hidden, weight):
        return self.scale(hidden) @ weight.t()


class TiedThroughOutputs(torch.nn.Module):
    """The embedding hands its weight on as an output; the head uses it (a tied output layer)."""

    def __init__(self):
        super().__init__()
        self.embed, self.lin, self.head = Embed(), torch.nn.Linear(8, 8), Head()

    def forward(self, ids):
        hidden, weight = self.embed(ids)
        return self.head(torch.tanh(self.lin(hidden)), weight)


def cross_entropy(logits, ids):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, 16), ids.reshape(-1))


def test_stage_3_gathers_a_parameter_that_one_module_returns_for_another():
    """DeepSpeed registers such a parameter as an external parameter of the enclosing module (its
    post-forward hook looks for parameters among a module's outputs) and keeps it gathered."""
    torch.manual_seed(0)
    model = TiedThroughOutputs()
    plain = copy.deepcopy(model)
    cfg = config(3, zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0})
    engine, *_ = zero.initialize(model=model, config=cfg)
    reference = torch.optim.AdamW(plain.parameters(), lr=0.1, weight_decay=0.0)
    ids = torch.randint(0, 16, (3, 2, 5), generator=torch.Generator().manual_seed(1))
    for step in range(3):
        loss = cross_entropy(engine(ids[step]), ids[step])
        engine.backward(loss)
        engine.step()
        expected = cross_entropy(plain(ids[step]), ids[step])
        expected.backward()
        reference.step()
        reference.zero_grad()
        assert abs(loss.item() - expected.item()) < 1e-5, step
    assert engine.module.embed.weight.numel() == 0   # released again after the forward
