"""The optimizer ``zero.initialize`` hands back: the engine's ZeRO optimizer, as DeepSpeed's is.

DeepSpeed returns its ZeRO optimizer (a ``DeepSpeedOptimizer``) wrapped around the client's, and
frameworks drive that object themselves: Lightning Fabric's DeepSpeed strategy calls its
``step()`` after ``engine.backward`` and never ``engine.step()``; the Lightning Trainer calls its
``zero_grad()`` between forward and backward; Accelerate reads its ``overflow``. Handing back the
client's torch optimizer instead let such a loop step the master partitions without the ZeRO
step (no unscale, no clipping, no write-back to the model): training went silently wrong
(issue 41).

``ZeroOptimizer.step()`` is the engine's own optimizer update (``ZeroEngine.update_parameters``:
gradients onto the masters, the global norm, skip or unscale-and-clip, the client optimizer,
masters back into the model); it advances neither the scheduler nor ``global_steps``, as
DeepSpeed's ZeRO optimizer does not: ``engine.step()`` adds those. ``param_groups`` and ``state``
are the client optimizer's own objects, so a scheduler built on either sees the same lrs.

Which class answers follows DeepSpeed's choice of wrapper (``engine._configure_optimizer``):
ZeRO stages 1-3 a ``ZeROOptimizer``; stage 0 with 16-bit weights a ``DeepSpeedOptimizer`` (its
FP16_Optimizer); stage 0 in fp32 DeepSpeed hands back the client optimizer itself, whose
``step()`` applies the all-reduced gradients unclipped and leaves them in place (``ClientStep``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from launcher.zero.errors import NotSupportedError, OptimizerStepError
from launcher.zero.optim.no_optimizer import NoOptimizer

if TYPE_CHECKING:  # pragma: no cover
    from launcher.zero.engine.zero_engine import ZeroEngine


class DeepSpeedOptimizer:
    """DeepSpeed's base of every optimizer its engine wraps (``deepspeed.runtime.base_optimizer``);
    here only a type for ``isinstance`` checks (Lightning's checkpoint load asks it)."""


class ZeROOptimizer(DeepSpeedOptimizer):
    """DeepSpeed's base of its ZeRO optimizers (stages 1-3)."""


@dataclass
class UpdateRecord:
    """What the last optimizer update left, shared by the engine and the optimizer it hands out."""

    overflow: bool = False                 # the last update was skipped on inf/NaN gradients
    stepped_by_optimizer: bool = False     # optimizer.step() applied the current gradients already


class EngineOptimizer:
    """The engine's optimizer as a script or framework holds it (see the module docstring)."""

    def __init__(self, engine: "ZeroEngine", record: UpdateRecord):
        self.engine = engine
        self.record = record
        self.optimizer: torch.optim.Optimizer = engine.basic_optimizer   # DeepSpeed's name for the client's

    # ---- what frameworks read -----------------------------------------------------------
    @property
    def param_groups(self) -> list[dict]:
        """The client optimizer's own list: an lr written here is the lr the next step uses."""
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def overflow(self) -> bool:
        """Whether the last update was skipped on inf/NaN gradients (Accelerate's step_was_skipped)."""
        return self.record.overflow

    @property
    def loss_scale(self) -> float:
        """The fp16 loss scale in use now; 1.0 without fp16."""
        return self.engine.get_loss_scale()

    cur_scale = loss_scale

    # ---- what frameworks call -----------------------------------------------------------
    def step(self, closure=None) -> None:
        """The ZeRO optimizer step on the gradients ``engine.backward`` reduced: unscale and clip,
        skip on overflow (fp16), the client optimizer, the masters back into the model, the
        gradients dropped. Neither the scheduler nor ``global_steps`` moves (``engine.step()``'s part)."""
        if closure is not None:
            raise OptimizerStepError("optimizer.step(closure): the engine's optimizer takes no closure",
                                     hint="run forward and engine.backward(loss) first, then optimizer.step()")
        if self.record.stepped_by_optimizer:
            raise second_step("optimizer.step()")
        self.engine.update_parameters()
        self.record.stepped_by_optimizer = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every gradient (model and master); gradients are always dropped, never zero-filled."""
        self.engine.zero_grad()

    def state_dict(self) -> dict:
        """This rank's optimizer state: the client optimizer's (over this rank's master partitions) and
        the loss scaler's. It loads back only at the same world size and stage; engine.save_checkpoint
        writes the checkpoint that loads at any world size."""
        scaler = self.engine.loss_scaler
        return {"zero_stage": self.engine.zero_config.zero_stage, "world_size": self.engine.dist_context.world_size,
                "optimizer_state_dict": self.optimizer.state_dict(),
                "loss_scaler": scaler.state_dict() if scaler is not None else None}

    def load_state_dict(self, state_dict: dict) -> None:
        where = (self.engine.zero_config.zero_stage, self.engine.dist_context.world_size)
        if (state_dict["zero_stage"], state_dict["world_size"]) != where:
            raise OptimizerStepError(f"optimizer.load_state_dict: the state is of ZeRO stage {state_dict['zero_stage']} "
                                     f"at world size {state_dict['world_size']}, this engine runs stage {where[0]} "
                                     f"at world size {where[1]}",
                                     hint="use engine.save_checkpoint / engine.load_checkpoint, which reshard")
        self.optimizer.load_state_dict(state_dict["optimizer_state_dict"])
        if self.engine.loss_scaler is not None and state_dict["loss_scaler"] is not None:
            self.engine.loss_scaler.load_state_dict(state_dict["loss_scaler"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.optimizer!r})"


class ZeroOptimizer(EngineOptimizer, ZeROOptimizer):
    """ZeRO stages 1-3: DeepSpeed's DeepSpeedZeroOptimizer / DeepSpeedZeroOptimizer_Stage3."""

    def __getattr__(self, name: str):
        """DeepSpeed stage 3's hook machinery, which TRL's ``unwrap_model_for_generation`` takes apart
        around generation (``remove_hooks``/``add_hooks``), is not this engine's: say so by name."""
        if name in STAGE3_HOOK_INTERNALS and self.engine.zero_config.zero_stage == 3:
            raise NotSupportedError(f"optimizer.{name}: DeepSpeed ZeRO-3's parameter-offload hooks and coordinator "
                                    "are internals this engine does not have (TRL reaches them to generate with the "
                                    "model gathered whole)",
                                    hint="generate with the model partitioned: TRL's ds3_gather_for_generation=False")
        if name in ("offload_states", "reload_states"):
            raise NotSupportedError(f"optimizer.{name}: moving the optimizer's states to the host between steps and "
                                    "back (DeepSpeed 0.19's offload_states/reload_states, as RLHF frameworks call "
                                    "around generation) is not built in this engine",
                                    hint='keep the states on the device, or set "offload_optimizer": {"device": '
                                         '"cpu"} to keep them on the host throughout')
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")


#: what TRL's remove_hooks/add_hooks read off DeepSpeed's stage-3 optimizer (trl.models.utils)
STAGE3_HOOK_INTERNALS = ("parameter_offload", "param_coordinator", "forward_hooks", "backward_hooks",
                         "_register_deepspeed_module")


class MixedPrecisionOptimizer(EngineOptimizer, DeepSpeedOptimizer):
    """Stage 0 with fp16 or bf16 weights: DeepSpeed's FP16_Optimizer (not a ZeROOptimizer)."""


class ClientStep(EngineOptimizer):
    """Stage 0 in fp32, where DeepSpeed hands back the client optimizer itself: ``step()`` applies
    the all-reduced gradients as they are (no clipping, which ``engine.step()`` alone does) and
    leaves them in place, so ``engine.step()`` after it steps a second time, as there."""

    def step(self, closure=None) -> None:
        if closure is not None:
            raise OptimizerStepError("optimizer.step(closure): the engine's optimizer takes no closure",
                                     hint="run forward and engine.backward(loss) first, then optimizer.step()")
        self.engine.apply_gradients_unclipped()

    def __getattr__(self, name: str):
        """What this class does not define is the client optimizer's, as when DeepSpeed hands that
        optimizer itself back (1-bit Adam's ``last_step_comm``, Lamb's ``get_lamb_coeffs``)."""
        if name.startswith("__") or name in ("engine", "record", "optimizer"):   # unpickling, half-built
            raise AttributeError(name)
        return getattr(self.optimizer, name)


def handed_out_optimizer(engine: "ZeroEngine", record: UpdateRecord) -> EngineOptimizer | None:
    """The optimizer object ``initialize`` returns for this engine (DeepSpeed's choice of wrapper);
    None for an engine built without an optimizer at stage 0 in fp32 or fp16, as DeepSpeed's."""
    if isinstance(engine.basic_optimizer, NoOptimizer) and engine.zero_config.zero_stage == 0 \
            and not engine.zero_config.bf16.enabled:
        return None
    if engine.zero_config.zero_stage > 0:
        return ZeroOptimizer(engine, record)
    if engine.precision.param_dtype != torch.float32:
        return MixedPrecisionOptimizer(engine, record)
    return ClientStep(engine, record)


def second_step(caller: str) -> OptimizerStepError:
    return OptimizerStepError(
        f"{caller}: optimizer.step() already applied these gradients; with no backward in between there is "
        "nothing to step (DeepSpeed 0.19.8 fails here too, with a TypeError)",
        hint="call engine.step() (it steps the optimizer and the scheduler) or optimizer.step(), not both")
