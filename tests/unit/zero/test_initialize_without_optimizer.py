"""``initialize`` with no optimizer and no ``optimizer`` section: an engine for evaluation (issue 41).

TRL's ``prepare_deepspeed`` builds DPO's reference model so (stage 0, or 3 when training runs at 3),
and Lightning its ``validate``/``predict`` engine. DeepSpeed 0.19.8 returns an engine whose forward is
the model's; its optimizer is None at stage 0 in fp32 (a ``DeepSpeedZeRoOffload`` at 3), and stages
1 and 2 refuse. Training such an engine against DeepSpeed is tests/dist/test_trl.py (DPO).
"""
import pytest
import torch

from launcher import zero
from launcher.zero.errors import ConfigError, OptimizerStepError


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def config(stage: int) -> dict:
    return {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage}}


@pytest.mark.parametrize("stage", [0, 3])
def test_the_engine_runs_the_models_forward(stage):
    inputs = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model()(inputs)
    engine, optimizer, loader, scheduler = zero.initialize(model=model(), config=config(stage))
    engine.eval()
    with torch.no_grad():
        assert torch.allclose(engine(inputs), expected, rtol=0, atol=1e-7)
    assert loader is None and scheduler is None
    assert (optimizer is None) is (stage == 0)      # DeepSpeed: None at 0, its parameter offload at 3


def test_an_engine_built_with_parameters_for_nothing_still_holds_the_whole_model():
    """Lightning's inference engine passes model_parameters=[]."""
    engine, _, _, _ = zero.initialize(model=model(), config=config(3), model_parameters=[])
    with torch.no_grad():
        assert engine(torch.ones(1, 4)).shape == (1, 2)


@pytest.mark.parametrize("stage", [1, 2])
def test_stages_that_partition_optimizer_states_refuse_as_deepspeeds_do(stage):
    with pytest.raises(ConfigError, match=f"ZeRO stage {stage} partitions the optimizer's states and needs one"):
        zero.initialize(model=model(), config=config(stage))


def test_stepping_it_says_there_is_no_optimizer():
    engine, _, _, _ = zero.initialize(model=model(), config=config(3))
    engine.backward(engine(torch.ones(2, 4)).square().mean())
    with pytest.raises(OptimizerStepError, match="built without an optimizer"):
        engine.step()
