"""DeepSpeed calls of issue 41 item 2 that need two ranks to show (tests/unit/zero/test_deepspeed_calls.py
has the one-rank side): a two-stage pipeline without loss_fn evaluates to its mean output on both stages."""
import pytest
import torch

from tests.helpers.world import REPO, check, run_world

WORKER = REPO / "tests" / "dist" / "workers" / "deepspeed_calls_worker.py"


@pytest.mark.timeout(240)
def test_a_two_stage_pipeline_without_loss_fn_evaluates_to_its_mean_output_on_every_stage():
    first, last = (result.records()[0] for result in check(run_world(WORKER, 2, "pipe_eval", timeout=200)))
    mean = torch.tensor(last["mean"])
    assert mean.shape == (2, 2) and first["mean"] == last["mean"] and first["dtype"] == "torch.float32"
    assert first["logits"] is None and first["each"] is None   # logits and the unreduced list stay on the last stage
    each = torch.tensor(last["each"])
    assert torch.allclose(mean, each.mean(0)) and torch.allclose(torch.tensor(last["logits"]), each[1])
