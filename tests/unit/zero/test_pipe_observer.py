"""The pipeline engine's watchers go through the StepObserver (engine/step_observer.py): the schedule's
timing that scripts/bench_pipeline.py reads is there after each batch, train or eval. One rank, gloo, CPU."""
import pytest
import torch

from launcher import zero
from launcher.zero.pipe import LayerSpec, PipelineModule

CONFIG = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "Adam", "params": {"lr": 0.1}}}


@pytest.fixture
def engine():
    torch.manual_seed(0)
    module = PipelineModule([LayerSpec(torch.nn.Linear, 2, 2), LayerSpec(torch.nn.Linear, 2, 2)], num_stages=1,
                            loss_fn=torch.nn.functional.mse_loss)
    engine, *_ = zero.initialize(model=module, config=CONFIG)
    yield engine
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_each_batch_leaves_its_schedule_timing(engine):
    assert engine.schedule_timing == {}
    x = torch.randn(1, 2)
    engine.train_batch(iter([(x, x)] * 2))
    trained = engine.schedule_timing
    assert set(trained) == {"wall_s", "recv_wait_s"} and trained["wall_s"] > 0 and trained["recv_wait_s"] == 0.0
    engine.eval_batch(iter([(x, x)] * 2))
    assert engine.schedule_timing is not trained and engine.schedule_timing["wall_s"] > 0
