"""The engine: the training step in one place (forward, backward, step), DeepSpeed's API.

Where tensors live and how they move between ranks is the strategy's job (strategy.py); the
engine owns the counters, loss scaling, clipping, the overflow decision, the scheduler,
progress output and checkpoints (ckpt.py).
"""
from __future__ import annotations

import contextlib

import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from launcher.zero.config.schema import ZeroConfig
from launcher.zero.distributed.context import DistContext
from launcher.zero.engine.accessors import EngineAccessors
from launcher.zero.errors import ConfigError
from launcher.zero.engine.loss_scaler import LossScaler
from launcher.zero.engine.monitor import Monitor, PhaseTimer, progress_line
from launcher.zero.engine.plain_backward import BackwardHooks
from launcher.zero.engine.precision import PrecisionPolicy
from launcher.zero.stages.base import DeviceNorm, ZeroStrategy, clip_factor


@dataclass(frozen=True)
class TensorParallelInfo:
    """This rank's place on the tensor axis (``zero.initialize(mpu=)``), and how its shards split."""

    rank: int = 0
    size: int = 1
    partition_dims: tuple = ()        # (parameter name, dim) for every tensor-parallel shard


@dataclass
class EngineParts:
    """What zero.initialize assembled for the engine."""

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any
    config: ZeroConfig
    dist_context: DistContext
    precision: PrecisionPolicy
    strategy: ZeroStrategy
    loss_scaler: LossScaler | None
    monitor: Monitor
    dataloader: Any = None


class ZeroEngine(EngineAccessors, torch.nn.Module):
    """Wraps a module for ZeRO data-parallel training; call it, ``backward(loss)``, ``step()``.

    An ``nn.Module`` whose one child is ``module``, as DeepSpeed's engine is: integrations walk it
    (accelerate's ``has_compiled_regions``, ``extract_model_from_parallel``). ``config`` is the
    config dict as given (DeepSpeed's meaning: Hugging Face reads ``engine.config.get(...)``);
    the checked, typed config is ``zero_config``.
    """

    def __init__(self, parts: EngineParts):
        torch.nn.Module.__init__(self)
        self.module = parts.module
        self.optimizer = parts.optimizer
        self.lr_scheduler = parts.lr_scheduler
        self.zero_config = parts.config
        self.dist_context = parts.dist_context
        self.precision = parts.precision
        self.strategy = parts.strategy
        self.loss_scaler = parts.loss_scaler
        self.monitor = parts.monitor
        self.training_dataloader = parts.dataloader
        self.global_steps = 0
        self.global_samples = 0
        self.skipped_steps = 0
        self.micro_steps = 0
        self._boundary_override: bool | None = None
        self._step_applied = False
        self._global_grad_norm: float | None = None
        self._loss_sum: torch.Tensor | None = None
        self._loss_count = 0
        self._last_report = (time.perf_counter(), 0)
        self._started = time.perf_counter()
        # the progress line's "step=N/total" and ETA: a schedule's length, else what the script sets
        self.total_steps: int | None = getattr(self.lr_scheduler, "total_num_steps", None)
        self._tokens_per_sample: int | None = None
        sync = torch.cuda.synchronize if self.dist_context.device.type == "cuda" else None
        self.timers = PhaseTimer(self.zero_config.wall_clock_breakdown, sync)
        self._backward_hooks = BackwardHooks(self.strategy.stage, self._loss_factor,
                                             self._backward_prologue, self.strategy.post_backward)

    @property
    def config(self) -> dict:
        """The config as a dict, DeepSpeed's ``engine.config`` (``"auto"`` values as given)."""
        return self.zero_config.raw

    # ---- module pass-throughs -------------------------------------------------------------
    def train(self, mode: bool = True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def parameters(self, recurse: bool = True):
        self.wait_for_step()
        return self.module.parameters(recurse)

    def named_parameters(self, *args, **kwargs):
        self.wait_for_step()
        return self.module.named_parameters(*args, **kwargs)

    def state_dict(self, *args, **kwargs):
        self.wait_for_step()
        return self.strategy.module_state_dict()

    def wait_for_step(self) -> None:
        """With ``offload_optimizer.overlap_step``: block until the last step's background update is
        done and re-raise its error. The engine's own methods call it; call it before reading
        ``engine.module``'s parameters directly after ``step()``. A no-op otherwise."""
        self.strategy.wait_for_step()

    # ---- the step -------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        with self._explain_out_of_memory():
            return self._forward(*args, **kwargs)

    def _forward(self, *args, **kwargs):
        self.timers.start("forward")
        if self.zero_config.fp16.enabled and self.zero_config.fp16.auto_cast:
            args, kwargs = _cast_floats(args, torch.float16), _cast_floats(kwargs, torch.float16)
        self.strategy.pre_forward()
        if args and torch.is_tensor(args[0]) and args[0].dim() >= 2 and not args[0].is_floating_point():
            self._tokens_per_sample = int(args[0].shape[1])   # token ids (batch, sequence): for tokens/s
        output = self.module(*args, **kwargs)
        self.strategy.post_forward()
        self._backward_hooks.mark(output)
        self.timers.stop("forward")
        return output

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True) -> torch.Tensor:
        """Backpropagate ``loss / gradient_accumulation_steps`` (times the fp16 loss scale)."""
        with self._explain_out_of_memory():
            return self._backward(loss, retain_graph, scale_wrt_gas)

    def _backward(self, loss: torch.Tensor, retain_graph: bool, scale_wrt_gas: bool) -> torch.Tensor:
        self.timers.start("backward")
        detached = loss.detach().float()
        self._loss_sum = detached if self._loss_sum is None else self._loss_sum + detached
        self._loss_count += 1
        if scale_wrt_gas and self.gradient_accumulation_steps() > 1:
            loss = loss / self.gradient_accumulation_steps()
        scaled = loss * self.loss_scaler.scale if self.loss_scaler is not None else loss
        boundary = self._backward_prologue()
        self._backward_hooks.inside_engine_backward = True
        try:
            scaled.backward(retain_graph=retain_graph)
        finally:
            self._backward_hooks.inside_engine_backward = False
        self.strategy.post_backward(boundary)
        self.timers.stop("backward")
        return loss

    def _loss_factor(self) -> float:
        """What engine.backward multiplies the loss by: 1 / GAS, times the fp16 loss scale."""
        factor = 1.0 / self.gradient_accumulation_steps()
        return factor * self.loss_scaler.scale if self.loss_scaler is not None else factor

    def _backward_prologue(self) -> bool:
        """The strategy's pre_backward for this micro-step (from engine.backward or a plain backward)."""
        boundary = self.is_gradient_accumulation_boundary()
        self.strategy.pre_backward(boundary)
        return boundary

    def step(self, lr_kwargs: dict | None = None) -> None:
        """On an accumulation boundary: update (or skip on overflow), step the scheduler."""
        self._step_applied = False
        if self.is_gradient_accumulation_boundary():
            self.timers.start("step")
            with self._explain_out_of_memory():
                self._take_model_step(lr_kwargs)
            self.timers.stop("step")
            self._report()
        self.micro_steps += 1
        self._boundary_override = None

    @contextlib.contextmanager
    def _explain_out_of_memory(self):
        """Re-raise an out-of-memory error with the memory estimate and a config that fits."""
        try:
            yield
        except OUT_OF_MEMORY as error:
            from launcher.zero.engine.estimate import out_of_memory_note
            try:
                note = out_of_memory_note(self.module, self.zero_config, self.dist_context.world_size,
                                          self.dist_context.local_world_size, self.dist_context.device)
            except Exception as failure:  # the note must never hide the real error
                note = f"(no memory estimate: {failure})"
            raise type(error)(f"{error}\n[zero] {note}") from error

    def _take_model_step(self, lr_kwargs: dict | None) -> None:
        self.strategy.wait_for_step()   # the previous step's background update (overlap_step)
        self.strategy.prepare_master_grads()
        total = self.strategy.grad_square_sum() if self._norm_may_stay_on_device() else None
        if total is not None:
            self._step_without_sync(total, lr_kwargs)
            return
        stats = self.strategy.grad_norm_and_overflow()
        scale = self.get_loss_scale()
        in_background = False   # overlap_step: the strategy runs the update (and its zero_grad) itself
        if stats.overflow and (self.precision.param_dtype != torch.bfloat16 or self.zero_config.bf16.check_grad_overflow):
            self._skip_step(scale)
        else:
            norm = stats.norm / scale
            clip = self.zero_config.gradient_clipping
            # DeepSpeed fuses unscaling and clipping: grads /= scale * max(1, (norm + 1e-6) / clip)
            combined = scale * max(1.0, (norm + 1e-6) / clip) if clip > 0 else scale
            self.strategy.scale_master_grads(1.0 / combined)
            in_background = self.strategy.step_in_background(self.optimizer)
            if not in_background:
                self.optimizer.step()
                self.strategy.after_optimizer_step()
            self._after_update(norm, lr_kwargs)
        if not in_background:
            self.strategy.zero_grad()
        self._count_step()

    def _norm_may_stay_on_device(self) -> bool:
        """Whether this step needs no host sync: bf16 without ``check_grad_overflow`` (a non-finite
        norm never skips the step) and no loss scaler, and an optimizer that takes its gradients
        on the device (an offloaded CPU Adam needs the factor as a number)."""
        return (self.loss_scaler is None and self.precision.param_dtype == torch.bfloat16
                and not self.zero_config.bf16.check_grad_overflow and self.strategy.masters_on_device)

    def _step_without_sync(self, total: torch.Tensor, lr_kwargs: dict | None) -> None:
        """The step of ``_take_model_step`` with the clip factor kept on the device: the same
        arithmetic (an infinite norm zeroes the gradients), and the norm read only when asked for."""
        clip = self.zero_config.gradient_clipping
        if clip > 0:
            self.strategy.scale_master_grads(clip_factor(total, 1.0, clip))
        self.optimizer.step()
        self.strategy.after_optimizer_step()
        self._after_update(DeviceNorm(total), lr_kwargs)
        self.strategy.zero_grad()
        self._count_step()

    def _after_update(self, norm, lr_kwargs: dict | None) -> None:
        if self.loss_scaler is not None:
            self.loss_scaler.update(False)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step(**(lr_kwargs or {}))
        self._global_grad_norm = norm
        self._step_applied = True

    def _count_step(self) -> None:
        self.global_steps += 1
        self.global_samples += self.train_batch_size()

    def _skip_step(self, scale: float) -> None:
        self.skipped_steps += 1
        self._global_grad_norm = None
        if self.loss_scaler is not None:
            self.monitor.log(f"OVERFLOW! Skipping step {self.global_steps + 1}. Attempted loss scale: {scale:g}")
            self.loss_scaler.update(True)
            if self.loss_scaler.rules.dynamic:
                self.monitor.log(f"Reducing loss scale to {self.loss_scaler.scale:g}")
        else:
            self.monitor.log(f"non-finite gradients (inf/NaN) at step {self.global_steps + 1}: step skipped")

    def _report(self) -> None:
        every = self.zero_config.steps_per_print
        printing = bool(every) and self.global_steps % every == 0
        loss = None
        # the loss is read (a host sync) only for a step that prints or records it
        if self._loss_sum is not None and (printing or self.monitor.records):
            loss = float(self._loss_sum.item()) / max(1, self._loss_count)
            if not math.isfinite(loss):
                self.monitor.warn(f"loss is {loss} at step {self.global_steps}")
        self._loss_sum, self._loss_count = None, 0
        values = {"Train/Samples/lr": self.get_lr()[0]}
        if loss is not None:
            values["Train/Samples/train_loss"] = loss
        if self.loss_scaler is not None:
            values["Train/Samples/loss_scale"] = self.get_loss_scale()
        self.monitor.events(self.global_samples, values)
        if printing:
            now, samples = time.perf_counter(), self.global_samples
            then, before = self._last_report
            rate = (samples - before) / max(now - then, 1e-9)
            self._last_report = (now, samples)
            lrs = ",".join(f"{lr:.4e}" for lr in dict.fromkeys(self.get_lr()))
            values = {"loss": loss, "lr": lrs, "loss_scale": self.get_loss_scale(), "skipped": self.skipped_steps}
            self.monitor.log(progress_line(self.global_steps, self.total_steps, values, rate,
                                           self._tokens_per_sample, now - self._started))
            if self.zero_config.wall_clock_breakdown:
                self.monitor.log(f"time (ms) | {self.timers.report()}")
            if self.zero_config.memory_breakdown:
                self.monitor.log("memory (MiB) | " + " | ".join(
                    f"{k}: {v / 2**20:.2f}" for k, v in self.memory_breakdown().items()))

    # ---- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest: bool = True,
                        exclude_frozen_parameters: bool = False) -> bool:
        """Collective: every rank writes its shard; returns once the checkpoint is complete."""
        from launcher.zero.checkpoint.save_load import save_checkpoint

        self.wait_for_step()
        return save_checkpoint(self, save_dir, tag=tag, client_state=client_state or {}, save_latest=save_latest)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict: bool = True, load_optimizer_states: bool = True,
                        load_lr_scheduler_states: bool = True, load_module_only: bool = False, custom_load_fn=None):
        """Restore a checkpoint (any world size); returns (path, client_state) or (None, None)."""
        from launcher.zero.checkpoint.save_load import load_checkpoint

        self.wait_for_step()
        return load_checkpoint(self, load_dir, tag=tag, load_module_strict=load_module_strict,
                               load_optimizer_states=load_optimizer_states,
                               load_lr_scheduler_states=load_lr_scheduler_states, load_module_only=load_module_only)

    #: set by zero.initialize(mpu=...): checkpoint files carry the tensor rank, metadata the partition dims
    tensor_parallel = TensorParallelInfo()

    @property
    def tensor_parallel_size(self) -> int:
        return self.tensor_parallel.size

    def module_state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False,
                          exclude_frozen_parameters: bool = False) -> dict:
        """The whole module's state dict on every rank (gathered at stage 3)."""
        self.wait_for_step()
        state = self.strategy.module_state_dict()
        if exclude_frozen_parameters:
            frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad}
            state = {k: v for k, v in state.items() if k not in frozen}
        return {prefix + k: v for k, v in state.items()}

    def zero_grad(self) -> None:
        """Drop the gradients accumulated so far (model and master)."""
        self.wait_for_step()
        self.strategy.zero_grad()

    def empty_partition_cache(self) -> None:
        """Stage 3: free the parameters still gathered (after an eval loop, say); no-op below."""
        self.wait_for_step()
        release = getattr(self.strategy, "release_gathered", None)
        if release is not None:
            release()

    def deepspeed_io(self, dataset, batch_size=None, route=None, pin_memory=None, data_sampler=None,
                     collate_fn=None, num_local_io_workers=None):
        """A DataLoader over this rank's share of ``dataset`` in micro-batches (as training_data=)."""
        from launcher.zero.engine.data import build_dataloader

        if data_sampler is not None or (batch_size not in (None, self.train_micro_batch_size_per_gpu())):
            raise ConfigError("deepspeed_io: a custom data_sampler or batch_size is not supported",
                              hint="build your own torch DataLoader, or leave both out")
        return build_dataloader(dataset, self.zero_config, self.dist_context, collate_fn)

    def no_sync(self):
        """Not supported: let the engine accumulate (``gradient_accumulation_steps``) instead."""
        from launcher.zero.errors import NotSupportedError

        raise NotSupportedError("engine.no_sync() is not supported by dslaunch's engine",
                                hint="set gradient_accumulation_steps in the config and call engine.step() "
                                     "every micro-step; the engine reduces gradients only where it must")

    def destroy(self) -> None:
        """Remove the engine's hooks from the module; the engine must not be used afterwards."""
        self.wait_for_step()
        self.strategy.destroy()

    def save_16bit_model(self, save_dir, save_filename: str = "pytorch_model.bin", exclude_frozen_parameters: bool = False) -> bool:
        """The module's state dict in its training dtype, written by rank 0."""
        self.wait_for_step()
        gather = getattr(self.strategy, "gathered_16bit_state_dict", None)
        state = gather() if gather is not None else self.strategy.module_state_dict()
        if state is None:  # stage 3 without stage3_gather_16bit_weights_on_model_save, as DeepSpeed
            if self.dist_context.rank == 0:
                print("[zero] save_16bit_model: nothing saved; set zero_optimization."
                      "stage3_gather_16bit_weights_on_model_save to true", flush=True)
            return False
        if self.dist_context.rank == 0:   # written aside and renamed: nobody ever reads half a file
            os.makedirs(save_dir, exist_ok=True)
            path = os.path.join(save_dir, save_filename)
            torch.save(state, path + ".partial")
            os.replace(path + ".partial", path)
        if self.dist_context.world_size > 1:   # every rank returns once the file is there to read
            torch.distributed.barrier(group=self.dist_context.group)
        return True

    save_fp16_model = save_16bit_model   # DeepSpeed's older name


OUT_OF_MEMORY = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def _cast_floats(value, dtype):
    if torch.is_tensor(value):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_floats(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast_floats(v, dtype) for k, v in value.items()}
    return value
