"""The optimizer of an engine built without one: an evaluation or reference model.

DeepSpeed's ``initialize`` with no optimizer and no ``optimizer`` section (TRL's ``prepare_deepspeed``
for DPO's reference model, Lightning's engine for ``validate``/``predict``) builds its engine over a
``DummyOptim``: at ZeRO-3 the parameters are partitioned and gathered for forward as in training;
stages 1 and 2 refuse ("zero stage N requires an optimizer"). ``NoOptimizer`` is that placeholder
here: it holds the parameters and never steps.
"""
from __future__ import annotations

import torch

from launcher.zero.errors import ConfigError, OptimizerStepError


class NoOptimizer(torch.optim.Optimizer):
    """DeepSpeed's ``DummyOptim``: the parameters, lr 0, and a ``step()`` that says there is none."""

    def __init__(self, params):
        super().__init__(params, {"lr": 0.0})

    def step(self, closure=None):
        raise OptimizerStepError("step(): this engine was built without an optimizer (initialize got none and the "
                                 "config has no 'optimizer' section), so it can run forward but not train",
                                 hint="pass optimizer= to deepspeed.initialize, or add an \"optimizer\" section")


def no_optimizer(params, stage: int) -> NoOptimizer:
    """The placeholder of an engine for evaluation; ZeRO stages 1 and 2 partition optimizer states and
    refuse without an optimizer, as DeepSpeed's do."""
    if stage in (1, 2):
        raise ConfigError(f"no optimizer: ZeRO stage {stage} partitions the optimizer's states and needs one "
                          "(DeepSpeed: 'zero stage requires an optimizer'); the config has no 'optimizer' section "
                          "and none was passed",
                          hint='add "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}} or pass optimizer=; '
                               "an engine for evaluation only runs at stage 0 or 3")
    return NoOptimizer(params)
