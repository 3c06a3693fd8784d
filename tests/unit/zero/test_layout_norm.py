"""The clip norm under tensor parallelism comes from the layout, not from a subclass made at run time.

One process: an mpu whose tensor axis says size 2 over this one rank's group, so the layout's
tensor-parallel norm runs (shards summed over the tensor group, replicated parameters once) and,
with one rank in the group, must equal the plain norm of the same gradients.
"""
import pytest
import torch
import torch.distributed as dist

from launcher import zero
from launcher.zero.stages.base import resolve_strategy

CONFIG = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


class OneRankTensorAxis:
    """An mpu: data and tensor groups are this rank's own; the tensor axis reports 2 ranks."""

    def get_data_parallel_group(self):
        return dist.group.WORLD

    def get_data_parallel_world_size(self):
        return 1

    def get_model_parallel_group(self):
        return dist.group.WORLD

    def get_model_parallel_world_size(self):
        return 2

    def get_model_parallel_rank(self):
        return 0


def norm_after_one_step(stage, mpu=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    model[0].weight.tensor_model_parallel, model[0].weight.partition_dim = True, 0
    engine, *_ = zero.initialize(model=model, config={**CONFIG, "zero_optimization": {"stage": stage}}, mpu=mpu)
    loss = engine(torch.randn(4, 8)).pow(2).mean()
    engine.backward(loss)
    engine.step()
    strategy = engine.strategy
    return engine.get_global_grad_norm(), strategy


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_stage_keeps_its_class_and_its_norm_spans_the_tensor_axis(stage):
    plain, _ = norm_after_one_step(stage)
    dist.destroy_process_group()
    tensor, strategy = norm_after_one_step(stage, OneRankTensorAxis())
    assert type(strategy) is resolve_strategy(stage)          # no subclass made at run time
    assert strategy.context.parallel.size("tensor") == 2
    assert strategy.context.parallel.tensor_sharded_names == {"0.weight"}
    assert strategy.grad_square_sum() is None                 # two axes: the engine asks for the stats
    assert float(tensor) == pytest.approx(float(plain), rel=1e-6)
