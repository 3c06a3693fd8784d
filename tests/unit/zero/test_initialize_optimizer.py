"""What frameworks read off the optimizer ``initialize`` returns (issue 41), on one rank.

Training through it against DeepSpeed's losses is tests/dist/test_returned_optimizer.py.
"""
import pytest
import torch

from launcher import zero
from launcher.zero.errors import OptimizerStepError
from launcher.zero.runtime.base_optimizer import DeepSpeedOptimizer, ZeROOptimizer


@pytest.fixture(autouse=True)
def no_process_group_left():
    """Engines here start a one-rank group in the pytest process; other tests start their own."""
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def build(stage: int, **extra):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage}, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, **extra}
    engine, optimizer, _, _ = zero.initialize(model=model, config=config)
    return engine, optimizer


def backward(engine, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    engine.backward(engine(torch.randn(2, 4, generator=generator)).float().square().mean())


@pytest.mark.parametrize("stage,bf16,zero_type,deepspeed_type", [
    (1, False, True, True), (2, False, True, True), (3, False, True, True),
    (0, True, False, True),     # DeepSpeed's FP16_Optimizer: a DeepSpeedOptimizer, not a ZeROOptimizer
    (0, False, False, False),   # DeepSpeed hands back the client's optimizer itself
])
def test_isinstance_answers_as_deepspeeds_optimizer(stage, bf16, zero_type, deepspeed_type):
    engine, optimizer = build(stage, bf16={"enabled": bf16})
    assert optimizer is engine.optimizer    # Lightning Fabric leaves engine.optimizer out of its client state
    assert isinstance(optimizer, ZeROOptimizer) is zero_type
    assert isinstance(optimizer, DeepSpeedOptimizer) is deepspeed_type
    assert optimizer.optimizer is engine.basic_optimizer and isinstance(optimizer.optimizer, torch.optim.AdamW)
    if not deepspeed_type:   # there DeepSpeed returns the client optimizer: its own attributes answer
        assert optimizer.defaults is engine.basic_optimizer.defaults


def test_param_groups_are_the_client_optimizers_so_an_lr_written_there_is_used():
    engine, optimizer = build(2)
    assert optimizer.param_groups is engine.basic_optimizer.param_groups
    assert optimizer.state is engine.basic_optimizer.state
    optimizer.param_groups[0]["lr"] = 0.0   # a framework's own scheduler writes here
    before = [p.detach().clone() for p in engine.module.parameters()]
    backward(engine)
    optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(before, engine.module.parameters()))
    assert engine.get_lr() == [0.0]


def test_step_updates_the_model_but_not_the_scheduler_or_the_step_count():
    engine, optimizer = build(1, scheduler={"type": "WarmupLR", "params": {"warmup_min_lr": 0.001,
                                                                            "warmup_max_lr": 0.01,
                                                                            "warmup_num_steps": 2}})
    before = [p.detach().clone() for p in engine.module.parameters()]
    backward(engine)
    optimizer.step()
    assert not all(torch.equal(a, b) for a, b in zip(before, engine.module.parameters()))
    assert engine.global_steps == 0 and engine.get_lr() == [0.001] and not optimizer.overflow
    assert optimizer.loss_scale == optimizer.cur_scale == 1.0


def test_a_second_step_on_the_same_gradients_is_refused_as_deepspeed_refuses_it():
    engine, optimizer = build(2)
    backward(engine)
    optimizer.step()
    with pytest.raises(OptimizerStepError, match="already applied these gradients"):
        engine.step()
    with pytest.raises(OptimizerStepError, match="already applied these gradients"):
        optimizer.step()
    backward(engine, seed=2)   # new gradients: either may step them
    engine.step()
    assert engine.global_steps == 1


def test_state_dict_round_trip_and_refusals():
    engine, optimizer = build(2, fp16={"enabled": True, "auto_cast": True, "initial_scale_power": 4})
    backward(engine)
    optimizer.step()
    saved = optimizer.state_dict()
    assert saved["loss_scaler"]["state"]["scale"] == 16.0 and saved["optimizer_state_dict"]["state"]
    engine.basic_optimizer.state.clear()
    optimizer.load_state_dict(saved)
    assert optimizer.state_dict()["optimizer_state_dict"]["state"][0]["step"] == 1
    with pytest.raises(OptimizerStepError, match="stage 1 at world size 1, this engine runs stage 2"):
        optimizer.load_state_dict({**saved, "zero_stage": 1})
    with pytest.raises(OptimizerStepError, match="takes no closure"):
        optimizer.step(lambda: 0.0)
