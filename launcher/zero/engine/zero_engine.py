"""The engine: DeepSpeed's API over one training step, read top to bottom in this file.

A script calls ``engine(batch)``, ``engine.backward(loss)`` and ``engine.step()`` on every
micro-step. ``step()`` updates the model only on an accumulation boundary (accumulation.py);
that update is optimizer_step.py's ``take_model_step``, the pipeline engine's too: the optimizer
update (``update_parameters``: gradients onto the masters, the global norm, skip or
unscale-and-clip, the optimizer), then the scheduler and the counters. The optimizer
``initialize`` hands back (zero_optimizer.py) runs the same ``update_parameters``. Where tensors live and how they move between
ranks is the strategy's job (stages/base.py declares every method the engine calls); what
watches the step (timers, the progress line, stall beats, FLOPs, the inf/NaN trace) is called at
its boundaries through one StepObserver (step_observer.py); checkpoints are checkpoint/save_load.py's.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from launcher.zero.checkpoint import save_load
from launcher.zero.checkpoint.format import tensor_prefix
from launcher.zero.config.schema import ZeroConfig
from launcher.zero.distributed.context import DistContext
from launcher.zero.engine.accessors import EngineAccessors
from launcher.zero.engine.accumulation import Accumulation
from launcher.zero.engine.compiling import compile_engine
from launcher.zero.data.loader import ROUTES, build_dataloader
from launcher.zero.engine import fragment_access
from launcher.zero.engine.estimate import out_of_memory_note
from launcher.zero.engine.monitor import Monitor
from launcher.zero.engine.plain_backward import BackwardHooks
from launcher.zero.engine.reporting import Progress, StepFacts
from launcher.zero.engine.step_observer import StepObserver
from launcher.zero.engine.instruments import InstrumentedRun, StepInstruments
from launcher.zero.engine.optimizer_step import (StepCounters, StepOutcome, StepRules, norm_stays_on_device,
                                                 take_model_step, update_parameters)
from launcher.zero.engine.zero_optimizer import EngineOptimizer, UpdateRecord, handed_out_optimizer, second_step
from launcher.zero.errors import ConfigError, EngineUsageError, NotSupportedError
from launcher.zero.experts.wiring import ExpertSetup
from launcher.zero.precision.loss_scaler import LossScaler
from launcher.zero.precision.policy import PrecisionPolicy, skips_non_finite
from launcher.zero.stages.base import DeviceNorm, ZeroStrategy


@dataclass
class EngineParts:
    """What zero.initialize assembled for the engine. The parallel layout (every axis's ranks and group)
    comes with the strategy (``strategy.context.parallel``), so no field repeats a view of it."""

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any
    config: ZeroConfig
    precision: PrecisionPolicy
    strategy: ZeroStrategy
    loss_scaler: LossScaler | None
    monitor: Monitor
    dataloader: Any = None
    instruments: StepInstruments | None = None   # FLOPs, MFU and the non-finite diagnosis (instruments.py)
    #: MoE: this rank's expert groups and layers (checkpoints name experts by global id); empty without
    experts: ExpertSetup = field(default_factory=ExpertSetup)


class ZeroEngine(EngineAccessors, torch.nn.Module):
    """Wraps a module for ZeRO data-parallel training; call it, ``backward(loss)``, ``step()``.

    An ``nn.Module`` whose one child is ``module``, as DeepSpeed's engine is: integrations walk it
    (accelerate's ``has_compiled_regions``, ``extract_model_from_parallel``). ``config`` is the
    config dict as given (DeepSpeed's meaning: Hugging Face reads ``engine.config.get(...)``);
    the checked, typed config is ``zero_config``. ``optimizer`` is the engine's ZeRO optimizer
    (what ``initialize`` returns, zero_optimizer.py); ``basic_optimizer`` the client's torch
    optimizer it steps, over the master tensors.
    """

    def __init__(self, parts: EngineParts):
        torch.nn.Module.__init__(self)
        self.module = parts.module
        self.basic_optimizer = parts.optimizer
        self.lr_scheduler = parts.lr_scheduler
        self.zero_config = parts.config
        self.precision = parts.precision
        self.strategy = parts.strategy
        self.parallel_layout = parts.strategy.context.parallel   # every axis's degree and group (parallel_layout.py)
        self.loss_scaler = parts.loss_scaler
        self.monitor = parts.monitor
        self.training_dataloader = parts.dataloader
        self.experts = parts.experts
        self.instruments = parts.instruments or StepInstruments(parts.config, self.parallel_layout, parts.monitor, {})
        self.counters = StepCounters()     # global_steps, global_samples, skipped_steps (StepCounterAccessors)
        self._step_rules = StepRules(skips_non_finite=skips_non_finite(self.precision.param_dtype, self.zero_config),
                                     clip=self.zero_config.gradient_clipping, device=self.dist_context.device)
        self.accumulation = Accumulation(self.zero_config.gradient_accumulation_steps,
                                         self.zero_config.managed_gradient_accumulation)
        self._step_applied = False
        self._inside_no_sync = False   # engine.no_sync()
        self._global_grad_norm: float | DeviceNorm | None = None
        self._update = UpdateRecord()
        # None for an engine built without an optimizer at stage 0 in fp32/fp16, as DeepSpeed's
        self.optimizer: EngineOptimizer | None = handed_out_optimizer(self, self._update)
        sync = torch.cuda.synchronize if self.dist_context.device.type == "cuda" else None
        self.progress = Progress(self.zero_config, self.monitor, getattr(self.lr_scheduler, "total_num_steps", None), sync,
                                 self.instruments)
        hooks = BackwardHooks(self.strategy.stage, self._loss_factor, self._backward_prologue,
                              self.strategy.post_backward)
        run = InstrumentedRun(self.module, self.loss_scaler, self.strategy.stage,
                              self.zero_config.train_micro_batch_size_per_gpu, self.progress)
        # timers, progress line, stall beat, FLOPs, inf/NaN trace, plain-backward marks (step_observer.py)
        self.observer = StepObserver(self.counters, run, self.instruments, hooks, lambda: self.is_compiled,
                                     self.memory_breakdown)
        fragment_access.register(self)   # deepspeed.utils.safe_get_full_fp32_param(param) finds the engine

    @property
    def config(self) -> dict:
        """The config as a dict, DeepSpeed's ``engine.config`` (``"auto"`` values as given)."""
        return self.zero_config.raw

    @property
    def dist_context(self) -> DistContext:
        """The data axis of the layout (the ranks ZeRO shards over), what RankAccessors and scripts read."""
        return self.parallel_layout.data

    # ---- module pass-throughs -------------------------------------------------------------
    def __getattr__(self, name: str):
        """DeepSpeedEngine's: a name the engine does not have is looked up on the wrapped model
        (``engine.generate(...)``, ``engine.config_class``); neither has it: AttributeError."""
        try:
            return torch.nn.Module.__getattr__(self, name)   # parameters, buffers, submodules
        except AttributeError:
            pass
        module = self.__dict__.get("_modules", {}).get("module")
        if module is not None:
            try:
                return getattr(module, name)
            except AttributeError:
                pass
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

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

    # ---- the micro-step: forward, backward, step --------------------------------------------
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        with self._explain_out_of_memory():
            return self._forward(*args, **kwargs)

    def _forward(self, *args, **kwargs):
        self.observer.forward_begins()
        if self.zero_config.fp16.enabled and self.zero_config.fp16.auto_cast:
            args, kwargs = _cast_floats(args, torch.float16), _cast_floats(kwargs, torch.float16)
        self.strategy.pre_forward()          # stage 3 gathers parameters
        with self.observer.forward(args, kwargs):
            output = self.module(*args, **kwargs)
        self.strategy.post_forward()
        self.observer.forward_done(output)
        return output

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True) -> torch.Tensor:
        """Backpropagate ``loss / gradient_accumulation_steps`` (times the fp16 loss scale)."""
        self._refuse_without_optimizer("engine.backward")
        with self._explain_out_of_memory():
            return self._backward(loss, retain_graph, scale_wrt_gas)

    def _backward(self, loss: torch.Tensor, retain_graph: bool, scale_wrt_gas: bool) -> torch.Tensor:
        self.observer.backward_begins(loss)
        if scale_wrt_gas and self.gradient_accumulation_steps() > 1:
            loss = loss / self.gradient_accumulation_steps()
        scaled = loss * self.loss_scaler.scale if self.loss_scaler is not None else loss
        boundary = self._backward_prologue()
        with self.observer.backward():
            scaled.backward(retain_graph=retain_graph)
        self.strategy.post_backward(boundary)   # the micro-step's gradient communication is done
        self.observer.backward_done()
        return loss

    def _refuse_without_optimizer(self, call: str) -> None:
        """DeepSpeed asserts 'must provide optimizer during init in order to use backward' (and step)."""
        if self.optimizer is None:
            raise EngineUsageError(f"{call}: this engine was built without an optimizer (initialize got none and "
                                   "the config has no 'optimizer' section), so it only evaluates",
                                   hint='to train it, pass optimizer= to initialize or add "optimizer": {"type": '
                                        '"AdamW", "params": {"lr": 1e-3}} to the config')

    def _loss_factor(self) -> float:
        """What engine.backward multiplies the loss by: 1 / GAS, times the fp16 loss scale."""
        factor = 1.0 / self.gradient_accumulation_steps()
        return factor * self.loss_scaler.scale if self.loss_scaler is not None else factor

    def _backward_prologue(self) -> bool:
        """The strategy's pre_backward for this micro-step (from engine.backward or a plain backward)."""
        boundary = self.is_gradient_accumulation_boundary() and not self._inside_no_sync   # no_sync: no reduction
        self._update.stepped_by_optimizer = False   # new gradients: optimizer.step() may apply them
        self.strategy.pre_backward(boundary)
        return boundary

    def step(self, lr_kwargs: dict | None = None) -> None:
        """On an accumulation boundary: update (or skip on non-finite gradients), step the scheduler."""
        self._refuse_without_optimizer("engine.step()")
        if self._inside_no_sync:
            raise EngineUsageError("It is illegal to call engine.step() inside no_sync context manager",
                                   hint="call engine.step() after the with-block, following a backward outside it")
        self._step_applied = False
        self.observer.step_reached()
        if self.is_gradient_accumulation_boundary():
            with self.observer.step(), self._explain_out_of_memory():
                self._take_model_step(lr_kwargs)
            self.observer.step_done(self._step_facts())
        self.accumulation.advance()

    # ---- the optimizer step, at an accumulation boundary (engine/optimizer_step.py) -------------
    def _take_model_step(self, lr_kwargs: dict | None) -> None:
        if self._update.stepped_by_optimizer:   # DeepSpeed's ZeRO optimizer fails on it too (TypeError)
            raise second_step("engine.step()")
        outcome = take_model_step(self.strategy, self.basic_optimizer, self.loss_scaler, self.lr_scheduler,
                                  self._step_rules, self.counters, self.train_batch_size(), lr_kwargs, self._skip_log())
        self._record(outcome)
        self._step_applied = outcome.applied

    def _step_facts(self) -> StepFacts:
        """What the progress line, the metric events and the instruments read of a finished step."""
        return StepFacts(step=self.global_steps, samples=self.global_samples, lrs=self.get_lr(),
                         loss_scale=self.get_loss_scale(), fp16=self.loss_scaler is not None,
                         skipped=self.skipped_steps, grad_norm=self._global_grad_norm)

    def _skip_log(self):
        """Where a skipped step is said: fp16's overflow lines (the loss scaler's business); without
        fp16 the instruments' one message for the job says it (instruments.py), so nothing here."""
        return self.monitor.log if self.loss_scaler is not None else None

    def update_parameters(self) -> bool:
        """The optimizer update of one step without the scheduler or the counters, what DeepSpeed's
        ZeRO optimizer ``step()`` does (the optimizer ``initialize`` hands out calls it). True when
        the update was applied."""
        outcome = update_parameters(self.strategy, self.basic_optimizer, self.loss_scaler, self._step_rules,
                                    self.global_steps, self.monitor.log)
        self._record(outcome)
        return outcome.applied

    def _norm_may_stay_on_device(self) -> bool:
        """Whether this step needs no host sync (optimizer_step.norm_stays_on_device)."""
        return norm_stays_on_device(self.strategy, self._step_rules)

    def _record(self, outcome: StepOutcome) -> None:
        self._update.overflow = not outcome.applied
        self._global_grad_norm = outcome.norm

    def apply_gradients_unclipped(self) -> None:
        """Stage 0 in fp32: the client optimizer's own ``step()`` as DeepSpeed hands it back: the
        all-reduced gradients applied as they are, left in place (see zero_optimizer.ClientStep)."""
        self.strategy.wait_for_step()
        self.strategy.prepare_master_grads()
        self.basic_optimizer.step()
        self.strategy.after_optimizer_step()

    @contextlib.contextmanager
    def _explain_out_of_memory(self):
        """Re-raise an out-of-memory error with the memory estimate and a config that fits."""
        try:
            yield
        except OUT_OF_MEMORY as error:
            try:
                note = out_of_memory_note(self.module, self.zero_config, self.dist_context.world_size,
                                          self.dist_context.local_world_size, self.dist_context.device)
            except Exception as failure:  # the note must never hide the real error
                note = f"(no memory estimate: {failure})"
            raise type(error)(f"{error}\n[zero] {note}") from error

    # ---- the step's results and the accumulation boundary -----------------------------------
    def get_global_grad_norm(self) -> float | None:
        """The last applied step's norm (None after a skipped one); a sync-free step reads it now."""
        norm = self._global_grad_norm
        return norm.value() if isinstance(norm, DeviceNorm) else norm

    def was_step_applied(self) -> bool:
        return self._step_applied

    def is_gradient_accumulation_boundary(self) -> bool:
        return self.accumulation.is_boundary()

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        self.accumulation.set_boundary(is_boundary)

    @property
    def micro_steps(self) -> int:
        return self.accumulation.micro_steps

    @micro_steps.setter
    def micro_steps(self, value: int) -> None:   # a checkpoint load restores it
        self.accumulation.micro_steps = value

    @property
    def total_steps(self) -> int | None:
        """The progress line's total (step=N/total, ETA): the schedule's length, else what a script sets."""
        return self.progress.total_steps

    @total_steps.setter
    def total_steps(self, value: int | None) -> None:
        self.progress.total_steps = value

    @property
    def timers(self):
        """The phase timers behind ``wall_clock_breakdown``."""
        return self.progress.timers

    # ---- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest: bool = True,
                        exclude_frozen_parameters: bool = False) -> bool:
        """Collective: every rank writes its shard; returns once the checkpoint is complete.
        ``exclude_frozen_parameters``: the module state leaves out parameters without
        ``requires_grad`` (load such a checkpoint with ``load_module_strict=False``)."""
        self.wait_for_step()
        return save_load.save_checkpoint(self, save_dir, tag=tag, client_state=client_state or {},
                                         save_latest=save_latest, exclude_frozen_parameters=exclude_frozen_parameters)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict: bool = True, load_optimizer_states: bool = True,
                        load_lr_scheduler_states: bool = True, load_module_only: bool = False, custom_load_fn=None):
        """Restore a checkpoint (any world size); returns (path, client_state) or (None, None)."""
        if custom_load_fn is not None:
            raise NotSupportedError("load_checkpoint(custom_load_fn=...) is not supported by dslaunch's engine",
                                    hint="leave custom_load_fn out: the engine reads its own checkpoint format "
                                         "at any world size")
        self.wait_for_step()
        return save_load.load_checkpoint(self, load_dir, tag=tag, load_module_strict=load_module_strict,
                                         load_optimizer_states=load_optimizer_states,
                                         load_lr_scheduler_states=load_lr_scheduler_states,
                                         load_module_only=load_module_only)

    @property
    def tensor_parallel_size(self) -> int:
        return self.parallel_layout.size("tensor")

    def module_state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False,
                          exclude_frozen_parameters: bool = False) -> dict:
        """The whole module's state dict on every rank (gathered at stage 3)."""
        self.wait_for_step()
        state = self.strategy.module_state_dict()
        if exclude_frozen_parameters:
            state = without_frozen(state, self.module)
        return {prefix + k: v for k, v in state.items()}

    def zero_grad(self) -> None:
        """Drop the gradients accumulated so far (model and master)."""
        self.wait_for_step()
        self.strategy.zero_grad()

    def empty_partition_cache(self) -> None:
        """Stage 3: free the parameters still gathered (after an eval loop, say); no-op below."""
        self.wait_for_step()
        self.strategy.release_gathered()

    def deepspeed_io(self, dataset, batch_size=None, route="train", pin_memory=None, data_sampler=None,
                     collate_fn=None, num_local_io_workers=None):
        """DeepSpeed's loader over ``dataset``: this rank's ``DistributedSampler`` share in micro-batches.
        ``pin_memory`` (default: on a GPU) and ``num_local_io_workers`` (worker processes; default
        DeepSpeed's 2 x the GPUs this rank sees, 2 on a CPU) go to the DataLoader; routes "eval" and
        "predict" do not shuffle."""
        if route not in ROUTES:
            raise ConfigError(f"deepspeed_io: route {route!r} is not one of {ROUTES}", hint='route="train"')
        return build_dataloader(dataset, self.zero_config, self.dist_context, collate_fn, batch_size=batch_size,
                                data_sampler=data_sampler, route=route, num_workers=num_local_io_workers,
                                pin_memory=pin_memory)

    @contextlib.contextmanager
    def no_sync(self):
        """DeepSpeed's: inside, a backward keeps its gradients on this rank (no reduction); the first
        backward on a boundary after it reduces them with its own. Stages 0-1 only (stages 2-3 reduce
        as they go, and DeepSpeed refuses them too); no ``step()`` inside, no nesting."""
        if self.zero_config.zero_stage >= 2:
            raise EngineUsageError("no_sync context manager is incompatible with gradient partitioning logic of "
                                   f"ZeRO stage {self.zero_config.zero_stage}",
                                   hint="at stages 2-3 let the engine accumulate: gradient_accumulation_steps in the "
                                        "config, engine.step() after every backward")
        if self._inside_no_sync:
            raise EngineUsageError("no_sync context manager reentry is unsupported", hint="leave the outer block first")
        self._inside_no_sync = True
        try:
            yield
        finally:
            self._inside_no_sync = False

    def destroy(self) -> None:
        """Remove the engine's hooks from the module; the engine must not be used afterwards."""
        self.wait_for_step()
        if self._compiled is not None:
            self._compiled.undo()
        self.strategy.destroy()

    _compiled = None   # what engine.compile() compiled (engine/compiling.py)

    def compile(self, backend: str = "inductor", compile_kwargs: dict | None = None, schedule=None,
                compiled_autograd_enabled: bool = False) -> None:
        """torch.compile the module: whole at stages 0-2, per repeated block at stage 3; once."""
        if self._compiled is None:
            self.instruments.stop_tracing()   # hooks on every module would change what compiles
            self._compiled = compile_engine(self, backend, compile_kwargs, schedule, compiled_autograd_enabled)

    @property
    def is_compiled(self) -> bool:
        return self._compiled is not None

    def save_16bit_model(self, save_dir, save_filename: str = "pytorch_model.bin", exclude_frozen_parameters: bool = False) -> bool:
        """The module's state dict in its training dtype; collective. ``save_filename`` holds what
        global rank 0 holds, as DeepSpeed writes it; under ``mpu=`` that is tensor rank 0's shards,
        and tensor rank t > 0 writes its own beside it as ``model_<t>-<save_filename>`` (the
        checkpoints' prefix), so no shard is lost."""
        self.wait_for_step()
        state = self.strategy.gathered_16bit_state_dict()
        if state is None:  # stage 3 without stage3_gather_16bit_weights_on_model_save, as DeepSpeed
            if self.global_rank == 0:
                print("[zero] save_16bit_model: nothing saved; set zero_optimization."
                      "stage3_gather_16bit_weights_on_model_save to true", flush=True)
            return False
        if exclude_frozen_parameters:
            state = without_frozen(state, self.module)
        tensor = self.parallel_layout.tensor_parallel
        if self.dist_context.rank == 0:   # data rank 0 of each tensor rank; written aside and renamed
            os.makedirs(save_dir, exist_ok=True)
            name = save_filename if tensor.rank == 0 else tensor_prefix(tensor.rank, tensor.size) + save_filename
            path = os.path.join(save_dir, name)
            torch.save(state, path + ".partial")
            os.replace(path + ".partial", path)
        save_load.job_barrier(self)   # every rank returns once every file is there to read
        return True

    save_fp16_model = save_16bit_model   # DeepSpeed's older name


OUT_OF_MEMORY = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def without_frozen(state: dict, module: torch.nn.Module) -> dict:
    """``state`` without the parameters that do not train (``requires_grad`` False)."""
    frozen = {name for name, param in module.named_parameters() if not param.requires_grad}
    return {key: value for key, value in state.items() if key not in frozen}


def _cast_floats(value, dtype):
    if torch.is_tensor(value):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_floats(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast_floats(v, dtype) for k, v in value.items()}
    return value
