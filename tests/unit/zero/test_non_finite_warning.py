"""The per-rank "loss is nan at step N" warning: never where the watch's one message for the job has
explained the first non-finite step (nothing else about that step, nor later ones, which skipped=
counts), at every such step where nothing explained it (fp16, whose overflows are the loss scaler's
business)."""
import pytest
import torch

from launcher import zero
from tests.helpers.gpt import GPT, TINY


@pytest.mark.parametrize("precision, warnings", [({}, 0), ({"fp16": {"enabled": True}}, 2)])
def test_a_non_finite_loss_is_not_warned_of_when_the_diagnosis_said_it(capsys, precision, warnings):
    torch.manual_seed(0)
    model = GPT(TINY)
    poisoned = {"on": False}
    model.get_submodule("blocks.0.fc").register_forward_hook(
        lambda _m, _i, out: out * float("inf") if poisoned["on"] else None)
    engine, *_ = zero.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, **precision,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    try:
        for step in range(1, 5):
            poisoned["on"] = step in (2, 3)
            idx = torch.randint(0, TINY.vocab_size, (2, TINY.seq_len))
            engine.backward(engine(idx, idx))
            engine.step()
    finally:
        torch.distributed.destroy_process_group()
    err = capsys.readouterr().err
    assert engine.skipped_steps == 2
    assert err.count("warning: loss is nan at step") == warnings, err
    assert err.count("non-finite gradients at step 2:") == (1 if warnings == 0 else 0), err
    if warnings == 0:   # the watch's message alone: no "step skipped" line either
        assert "step skipped" not in err, err
