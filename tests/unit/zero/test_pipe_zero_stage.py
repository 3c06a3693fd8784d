"""ZeRO with pipelines: stage 1 partitions the optimizer state over the data axis; 2-3 are refused."""
import pytest
import torch

from launcher import zero
from launcher.zero.errors import ConfigError
from launcher.zero.pipe import LayerSpec, PipelineModule
from launcher.zero.config.load import load_config
from launcher.zero.distributed.context import DistContext
from launcher.zero.distributed.parallel_layout import single_axis_layout
from launcher.zero.precision.policy import precision_policy
from launcher.zero.pipeline.shard import OptimizerShard
from launcher.zero.stages.base import StrategyContext


@pytest.fixture(autouse=True)
def no_process_group_left():
    """zero.initialize starts a one-rank group in the pytest process; other tests start their own."""
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _module():
    return PipelineModule([LayerSpec(torch.nn.Linear, 2, 2)], num_stages=1, loss_fn=torch.nn.functional.mse_loss)


def _config(stage, optimizer="Adam"):
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
            "optimizer": {"type": optimizer}, "zero_optimization": {"stage": stage}}


@pytest.mark.parametrize("stage", [2, 3])
def test_stages_2_and_3_with_a_pipeline_are_config_errors_with_a_hint(stage):
    with pytest.raises(ConfigError, match=f"stage {stage} with pipeline parallelism is not supported") as caught:
        zero.initialize(model=_module(), config=_config(stage))
    assert '"stage": 1' in caught.value.hint


def test_stage_1_refuses_an_optimizer_with_per_tensor_statistics():
    with pytest.raises(ConfigError, match="'Lamb' computes per-tensor statistics"):
        zero.initialize(model=_module(), config=_config(1, "Lamb"))


def test_stage_1_steps_like_stage_0_on_one_data_rank():
    losses = []
    for stage in (0, 1):
        torch.manual_seed(0)
        engine, *_ = zero.initialize(model=_module(), config=_config(stage))
        x = torch.randn(1, 2)
        losses.append([float(engine.train_batch(iter([(x, x)] * 2))) for _ in range(3)])
    assert losses[0] == losses[1]


def _shard(tensors, data_rank, data_size):
    """A shard over ``data_size`` data ranks without a process group (no collective runs at data size 1)."""
    config = load_config(_config(1), world_size=data_size)
    ranks = DistContext(group=None, rank=data_rank, world_size=data_size, local_rank=0, device=torch.device("cpu"),
                        backend="gloo")
    return OptimizerShard(tensors, StrategyContext(config=config, parallel=single_axis_layout(ranks),
                                                   precision=precision_policy(config)))


def test_a_shard_takes_its_slice_of_a_state_saved_whole():
    """Saved at data size 1 (5 elements), loaded as data rank 1 of 2: elements 3-4 and one pad."""
    tensors = [torch.nn.Parameter(torch.arange(3.0)), torch.nn.Parameter(torch.arange(2.0))]
    whole = _shard(tensors, data_rank=0, data_size=1)
    optimizer = torch.optim.Adam([whole.param])
    for t in tensors:
        t.grad = torch.ones_like(t)
    whole.param.grad = whole.partition_of([t.grad for t in tensors])   # what PipelineStageStrategy's step does
    optimizer.step()
    whole.gather()
    saved = whole.full_state(optimizer)
    assert saved["optimizer"]["state"][0]["exp_avg"].numel() == 5
    half = _shard(tensors, data_rank=1, data_size=2)
    assert (half.low, half.partition_numel) == (3, 3)
    other = torch.optim.Adam([half.param])
    half.load_full_state(other, saved)
    assert other.state[half.param]["exp_avg"].tolist() == pytest.approx([0.1, 0.1, 0.0])


def test_bf16_master_weights_with_a_pipeline_are_refused_by_name():
    """The pipeline engine keeps fp32 masters: DeepSpeed's bf16 state keys are refused, not ignored."""
    from launcher.zero.errors import NotSupportedError

    config = dict(_config(1), bf16={"enabled": True, "bf16_master_weights_and_grads": True,
                                    "bf16_optimizer_states": True})
    with pytest.raises(NotSupportedError, match="bf16.bf16_master_weights_and_grads with pipeline") as caught:
        zero.initialize(model=_module(), config=config)
    assert "bf16_optimizer_states" in caught.value.hint


@pytest.mark.parametrize("stage", [0, 1])
def test_muon_with_a_pipeline_is_a_config_error_naming_both(stage):
    with pytest.raises(ConfigError, match="optimizer.type 'Muon' with pipeline parallelism") as caught:
        zero.initialize(model=_module(), config=_config(stage, optimizer="Muon"))
    assert "AdamW" in caught.value.hint
