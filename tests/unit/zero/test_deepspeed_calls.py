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
