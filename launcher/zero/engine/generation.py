"""``deepspeed.zero.unwrap_model_for_generation``: whole weights for a generation loop at stage 3.

Generation runs many short forwards; gathering and releasing every layer's weights in each of them
costs an all-gather per layer per token. As DeepSpeed's, the block gathers every parameter once and
lifts stage 3's gathering hooks until it ends, then puts them back (TRL generates with it).
"""
from __future__ import annotations

import contextlib

from launcher.zero.engine.zero_engine import ZeroEngine
from launcher.zero.stages.stage3.init_context import GatheredParameters
from launcher.zero.stages.stage3.strategy import Stage3Strategy


@contextlib.contextmanager
def unwrap_model_for_generation(model):
    """``with unwrap_model_for_generation(engine) as unwrapped:`` ``unwrapped`` is ``engine``, with
    whole weights and no gathering hooks at stage 3 (collective: every rank enters it); below stage 3
    the weights are whole already and the block changes nothing."""
    if not (isinstance(model, ZeroEngine) and isinstance(model.strategy, Stage3Strategy)):
        yield model
        return
    coordinator = model.strategy.coordinator
    with GatheredParameters(list(model.module.parameters())):
        coordinator.remove()
        try:
            yield model
        finally:
            coordinator.install()
