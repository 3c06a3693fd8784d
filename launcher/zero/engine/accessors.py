"""DeepSpeed's engine accessors: what a script reads off the engine besides forward/backward/step.

Mixins of ZeroEngine (zero_engine.py) and, for what means the same there, of the pipeline's
engine (pipeline/engine.py): views of what it was built with (``config``, ``dist_context``,
``optimizer``, ``loss_scaler``, ``precision``, ``strategy``, ``parallel_layout``); the step's own
state (counters, boundary, norm) is answered by the engine.
"""
from __future__ import annotations

import torch

from launcher.zero.checkpoint.tensors import clone_tensors_for_torch_save


class ConfigAccessors:
    """What both engines (this one and the pipeline's) answer from ``config``, ``optimizer`` and
    ``loss_scaler`` alone, under DeepSpeed's method names."""

    def train_batch_size(self) -> int:
        return self.zero_config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.zero_config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self.zero_config.gradient_accumulation_steps

    def zero_optimization_stage(self) -> int:
        return self.zero_config.zero_stage

    def get_lr(self) -> list[float]:
        groups = self.optimizer.param_groups if self.optimizer is not None else []   # None: an evaluation engine
        return [float(group["lr"]) for group in groups]

    def get_mom(self) -> list:
        groups = self.optimizer.param_groups if self.optimizer is not None else []
        return [group.get("betas", group.get("momentum")) for group in groups]

    def get_loss_scale(self) -> float:
        """The loss scale in use now (1.0 without fp16)."""
        return float(self.loss_scaler.scale) if self.loss_scaler is not None else 1.0

    def loss_scale(self) -> float:
        """DeepSpeed's meaning: the configured fp16.loss_scale (0 for dynamic)."""
        return self.zero_config.fp16.loss_scale

    # ---- added for scripts written against DeepSpeed (issue 17) --------------------------
    def fp16_enabled(self) -> bool:
        return bool(self.zero_config.fp16.enabled)

    def bfloat16_enabled(self) -> bool:
        return bool(self.zero_config.bf16.enabled)

    bf16_enabled = bfloat16_enabled

    def amp_enabled(self) -> bool:
        return False                       # apex AMP is not supported; fp16/bf16 are

    def zero_optimization(self) -> bool:
        return self.zero_config.zero_stage > 0

    def zero_offload_optimizer(self) -> bool:
        return bool(self.zero_config.zero_optimization.offload_optimizer_active)

    def zero_offload_param(self) -> bool:
        offload = self.zero_config.zero_optimization.offload_param
        return bool(offload is not None and offload.active)

    zero_cpu_offload = zero_offload_optimizer

    def gradient_clipping(self) -> float:
        return self.zero_config.gradient_clipping

    def steps_per_print(self) -> int | None:
        return self.zero_config.steps_per_print

    def wall_clock_breakdown(self) -> bool:
        return self.zero_config.wall_clock_breakdown

    def dynamic_loss_scale(self) -> bool:
        return self.fp16_enabled() and self.zero_config.fp16.loss_scale == 0

    def optimizer_name(self) -> str | None:
        return self.zero_config.optimizer.type if self.zero_config.optimizer is not None else None

    def scheduler_name(self) -> str | None:
        return self.zero_config.scheduler.type if self.zero_config.scheduler is not None else None

    # ---- what Hugging Face's integrations call (issue 30) ---------------------------------
    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        """Whether saving a stage-3 model gathers its weights (``stage3_gather_16bit_weights_on_model_save``)."""
        return bool(self.zero_config.zero_optimization.stage3_gather_16bit_weights_on_model_save)

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False) -> dict | None:
        """The whole model's state dict in its training dtype, on the CPU on rank 0 and None elsewhere;
        collective. DeepSpeed's name: accelerate's ``get_state_dict`` calls it at stage 3."""
        state = self.module_state_dict(exclude_frozen_parameters=exclude_frozen_parameters)
        return clone_tensors_for_torch_save(state) if self.dist_context.rank == 0 else None


class RankAccessors:
    """Where this rank stands, for both engines: ``dist_context`` is the ranks its ZeRO stage shards
    and averages over (the data-parallel ranks), torch.distributed the whole job."""

    @property
    def device(self) -> torch.device:
        return self.dist_context.device

    @property
    def global_rank(self) -> int:
        """This process's rank in the whole job (``dist_context.rank`` is its data-parallel rank,
        which differs under ``mpu=`` and in a pipeline)."""
        return torch.distributed.get_rank() if torch.distributed.is_initialized() else self.dist_context.rank

    @property
    def local_rank(self) -> int:
        return self.dist_context.local_rank

    @property
    def world_size(self) -> int:
        """Ranks in the whole job, as DeepSpeed's ``dist.get_world_size()``: ``dp_world_size`` times
        ``mp_world_size``."""
        return torch.distributed.get_world_size() if torch.distributed.is_initialized() else self.dist_context.world_size

    @property
    def dp_world_size(self) -> int:
        """The data-parallel size: the ranks this engine's ZeRO stage shards and averages over."""
        return self.dist_context.world_size


class StepCounterAccessors:
    """DeepSpeed's counters, for both engines: views of ``counters`` (engine/optimizer_step.py's
    StepCounters, which only the step and a checkpoint load write)."""

    @property
    def global_steps(self) -> int:
        return self.counters.global_steps

    @global_steps.setter
    def global_steps(self, value: int) -> None:
        self.counters.global_steps = value

    @property
    def global_samples(self) -> int:
        return self.counters.global_samples

    @global_samples.setter
    def global_samples(self, value: int) -> None:
        self.counters.global_samples = value

    @property
    def skipped_steps(self) -> int:
        return self.counters.skipped_steps

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        self.counters.skipped_steps = value


class EngineAccessors(ConfigAccessors, RankAccessors, StepCounterAccessors):
    """The data-parallel engine's views of its ranks, strategy and precision, besides ConfigAccessors."""

    def memory_breakdown(self) -> dict[str, int]:
        """Bytes this rank holds for parameters, gradients, master weights and optimizer state."""
        parts = dict(self.strategy.memory_breakdown())
        parts["total"] = sum(parts.values())
        return parts

    @property
    def mp_world_size(self) -> int:
        """The tensor-parallel size (``mpu.get_model_parallel_world_size()``); 1 without ``mpu=``."""
        return self.parallel_layout.size("tensor")

    @property
    def communication_data_type(self) -> torch.dtype:
        return self.precision.comm_dtype

    def get_data_types(self) -> tuple[torch.dtype, torch.dtype]:
        """(model dtype, gradient-accumulation dtype), as DeepSpeed returns them."""
        return self.precision.param_dtype, self.precision.grad_accum_dtype
