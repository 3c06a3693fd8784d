"""The ZeRO stage as a pluggable strategy: the protocol every stage implements, and its registry.

The engines own the training step: micro-step counting, loss scaling, checkpoints; the optimizer
step (clipping, the overflow decision, the scheduler) is engine/optimizer_step.py's, for both. A strategy owns *where tensors live and
how gradients and parameters move between ranks*. The engine talks to a strategy only through
the methods below, always in this order:

    setup(module, optimizer)                  once, from zero.initialize
    per micro-step:
        pre_forward(); out = module(...); post_forward()
        pre_backward(is_boundary); loss.backward(); post_backward(is_boundary)
    on an accumulation boundary (engine.step):
        prepare_master_grads()                master tensors get .grad: fp32, averaged over the
                                              data-parallel ranks, still times the loss scale
                                              (defer_cast: a 16->32-bit cast may wait for
                                              cast_master_grads, which divides as it casts)
        grad_norm_and_overflow()              collective; same answer on every rank
        then either (overflow)  zero_grad()
        or          scale_master_grads(1 / combined_scale); optimizer.step();
                    after_optimizer_step(); zero_grad()
                    (torch's fused Adam/AdamW over device masters takes the factor into its
                    kernel instead of scale_master_grads: optim/step_factor.py)
    a background step (offload_optimizer.overlap_step, ``overlap`` set): after scale_master_grads,
        start_background_step(optimizer) runs optimizer.step(), after_optimizer_step() and
        zero_grad() in the overlap's worker thread; wait_for_step() blocks on it before anything
        reads parameters or optimizer state
    checkpoints: fragments(), full_shapes(), module_state_dict(), load_module_state_dict(),
                 sync_params_from_master(), gathered_16bit_state_dict() (save_16bit_model)
    between steps: release_gathered() (engine.empty_partition_cache); destroy()
    reporting:   memory_breakdown(), nvme_summary(), offloaded_numel() (initialize's start lines)

Every method the engine calls is declared here; a stage overrides what it does differently, and
the engine never probes a strategy for optional methods.

Glossary. *master tensor*: a tensor the optimizer steps (fp32 unless configured otherwise); at
stages 1-3 it holds only this rank's *partition*. *fragment*: the part of one model parameter
that lives inside one master tensor on this rank (a stage-0 master holds whole parameters; a
partition may cut a parameter anywhere). Checkpoints are written as fragments, which is what
makes them independent of the world size and of the stage.

The optimizer handed to ``setup`` was built over the module's parameters (its param groups carry
the per-group hyper-parameters). ``setup`` must replace each group's ``"params"`` with the master
tensors of that group, leaving every other group key alone, so that schedulers keep working on
the same ``param_groups`` dicts. The optimizer state must still be empty at that point.

Registering a stage (ZeRO-3 and offload live in their own modules)::

    from launcher.zero.stages.base import ZeroStrategy, register_strategy
    class Stage3Strategy(ZeroStrategy): ...
    register_strategy(3, Stage3Strategy)                 # stage 3, no optimizer offload
    register_strategy(3, Stage3Strategy, offload=True)   # stage 3 with offload_optimizer

Entries may also be lazy ``"module:Class"`` strings; the defaults below point stage 3 at
``launcher.zero.stages.stage3:Stage3Strategy`` and offloaded stages 1/2 at their classes in
``launcher.zero.stages.offload``, imported only when a config asks for them.
"""
from __future__ import annotations

import contextlib

import importlib
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from launcher.zero.errors import ConfigError, NotSupportedError

from launcher.zero.stages.tensor_parallel_norm import GradStats, tensor_parallel_grad_stats

if TYPE_CHECKING:  # pragma: no cover
    from typing import Mapping

    from launcher.zero.config.load import ZeroConfig
    from launcher.zero.distributed.context import DistContext
    from launcher.zero.distributed.parallel_layout import ParallelLayout
    from launcher.zero.precision.policy import PrecisionPolicy


@dataclass(frozen=True)
class StrategyContext:
    """Everything a strategy needs besides the module and optimizer; built by the engine."""

    config: "ZeroConfig"            # resolved (batch triplet filled for this world size)
    #: the parallel layout (distributed/parallel_layout.py): every axis's degree and group; a
    #: collective asks it for its group (``parallel.group("data")``, ``parallel.expert_data(name)``)
    parallel: "ParallelLayout"
    precision: "PrecisionPolicy"    # param dtype, gradient-accumulation dtype, communication dtype
    reduce_gradients: bool = True   # False when the optimizer does its own gradient communication

    @property
    def dist_context(self) -> "DistContext":
        """The data-parallel axis (process group, rank, world_size, device): ``parallel.data``."""
        return self.parallel.data

    @property
    def expert_data_contexts(self) -> "Mapping[str, DistContext]":
        """MoE: ``ep_size_<N>`` -> the context over that size's expert-data ranks; a ``moe: True``
        param group of that name is reduced and partitioned over them (``parallel.experts``)."""
        return self.parallel.experts


@dataclass(frozen=True)
class Fragment:
    """One parameter's slice inside one master tensor on this rank (see module docstring)."""

    name: str                 # the parameter's name in module.named_parameters()
    group: int                # index of the optimizer param group the master belongs to
    master: torch.Tensor      # the master tensor (the one the optimizer sees)
    master_offset: int        # first element of the slice in master.view(-1)
    param_start: int          # first element of the slice in the flattened parameter
    numel: int                # length of the slice
    shape: tuple[int, ...]    # full shape of the parameter


class ZeroStrategy(ABC):
    """Base of every ZeRO stage. Subclasses set ``stage`` and implement the abstract methods."""

    stage: ClassVar[int]
    #: what the strategy runs with: the config, the parallel layout (the engine reads it too), precision
    context: StrategyContext
    #: True when each rank's master grads cover only its partition, so norms need a sum over ranks.
    partitioned_grads: ClassVar[bool] = True

    def __init__(self, context: StrategyContext):
        self.context = context
        self.module: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.hooks: list = []     # handles on the module and its parameters, removed by destroy()
        #: called by prepare_master_grads once the masters hold their gradients, before any norm:
        #: an optimizer whose clip sees what it makes of them (DeepSpeed's Muon at ZeRO 1 and 2)
        self.before_norm: list = []

    # ---- set-up -------------------------------------------------------------------------
    @abstractmethod
    def setup(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Take ownership of the trainable parameters and point the optimizer at master tensors."""

    # ---- forward / backward -------------------------------------------------------------
    def pre_forward(self) -> None:
        """Called before every forward (stage 3 gathers parameters here)."""

    def post_forward(self) -> None:
        """Called after every forward."""

    def pre_backward(self, is_boundary: bool) -> None:
        """Called before loss.backward(); ``is_boundary`` tells if this micro-step ends the accumulation."""

    @abstractmethod
    def post_backward(self, is_boundary: bool) -> None:
        """Called after loss.backward(): finish (wait for) the gradient communication of this micro-step."""

    # ---- the step ------------------------------------------------------------------------
    @abstractmethod
    def prepare_master_grads(self, defer_cast: bool = False) -> None:
        """Give every master tensor its averaged fp32 ``.grad`` (times the loss scale). With
        ``defer_cast`` a strategy may leave a dtype cast of the gradients (16-bit accumulation,
        fp32 masters) for ``cast_master_grads``, which applies the step's factor in the same pass;
        the norm then reads the gradients as accumulated (``norm_grads``)."""

    def cast_master_grads(self, scale: torch.Tensor | None) -> bool:
        """The casts ``prepare_master_grads(defer_cast=True)`` left: each master's ``.grad`` becomes
        its gradient divided by ``scale`` (a float32 tensor; None: cast only), one pass. False when
        none were left (the caller applies the factor its own way)."""
        return False

    @abstractmethod
    def master_tensors(self) -> list[torch.Tensor]:
        """The tensors the optimizer steps, one list entry per tensor (group order)."""

    def grad_norm_and_overflow(self) -> GradStats:
        """Global L2 norm and overflow flag of the master grads; a collective when partitioned.
        One host sync: the float of ``grad_square_sum``. Under tensor parallelism the sum spans the
        tensor axis too, shards summed and replicated parameters counted once (tensor_parallel_norm.py)."""
        if self.context.parallel.size("tensor") > 1:
            return tensor_parallel_grad_stats(self.fragments(), self.whole_parameter_names(), self.partitioned_grads,
                                              self.context.parallel)
        return stats_from_square_sum(self.grad_square_sum())

    def grad_square_sum(self) -> torch.Tensor | None:
        """The sum of squares of every master grad over all ranks, as a 0-dim float64 tensor on
        the device, without a host sync (collective when partitioned). Non-finite when any
        gradient is (inf/NaN anywhere: the overflow flag). None: this strategy has no such
        tensor (the engine then asks for ``grad_norm_and_overflow``): so under tensor parallelism,
        whose norm sums over two axes."""
        if self.context.parallel.size("tensor") > 1:
            return None
        return self.data_square_sum()

    def data_square_sum(self) -> torch.Tensor:
        """``grad_square_sum`` over the data axis alone (what a stage overrides)."""
        total = self.local_square_sum()
        if self.partitioned_grads and self.context.parallel.size("data") > 1:
            total = total.to(self.context.dist_context.device)
            torch.distributed.all_reduce(total, group=self.context.parallel.group("data"))
        return total

    def whole_parameter_names(self) -> set[str]:
        """Parameters every data rank holds whole although grads are partitioned (stage 3's small
        "persistent" ones): the tensor-parallel norm counts them on the first data rank only."""
        return set()

    def local_square_sum(self) -> torch.Tensor:
        """This rank's part of ``grad_square_sum`` (0-dim float64, on the gradients' device)."""
        return squares_of(self.norm_grads(), self.context.dist_context.device)

    def norm_grads(self) -> list[torch.Tensor | None]:
        """The gradients whose norm is the master grads' norm (offload measures them on the device)."""
        return [master.grad for master in self.master_tensors()]

    #: whether the optimizer steps device tensors (no offload): then a step needs no host sync
    #: where the overflow flag is not needed (see ZeroEngine._norm_may_stay_on_device)
    masters_on_device: ClassVar[bool] = True

    def scale_master_grads(self, factor: float | torch.Tensor) -> None:
        """Multiply every master grad by ``factor`` (unscale and clip in one pass); a 0-dim
        device tensor stays on the device."""
        if not torch.is_tensor(factor) and factor == 1.0:
            return
        for master in self.master_tensors():
            if master.grad is not None:
                master.grad.mul_(factor)

    #: a StepOverlap when ``offload_optimizer.overlap_step`` is on and the strategy supports it:
    #: its worker thread, not the training thread, then runs the optimizer (start_background_step)
    overlap = None

    #: ``engine.compile()``: a strategy that gathers parameters in hooks (stage 3) defines
    #: ``compile_units(blocks, rest)`` to gather each block's parameters as one around its compiled
    #: forward (``rest``: and the parameters outside the blocks as one around the module's);
    #: None: the module compiles as the compile settings say
    compile_units = None

    def start_background_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Start ``optimizer.step()``, ``after_optimizer_step()`` and ``zero_grad()`` in ``overlap``'s
        worker thread and return at once; the optimizer step calls it only where ``overlap`` is set."""
        raise NotSupportedError(f"a background optimizer step (offload_optimizer.overlap_step) at {type(self).__name__}")

    def wait_for_step(self) -> None:
        """Block until a background step is done (re-raising its error); a no-op without one."""
        if self.overlap is not None:
            self.overlap.wait()

    @abstractmethod
    def after_optimizer_step(self) -> None:
        """Copy updated masters into the model parameters (and all-gather them when partitioned)."""

    @abstractmethod
    def zero_grad(self) -> None:
        """Drop every gradient (model and master) so the next accumulation starts from zero."""

    # ---- checkpoints ---------------------------------------------------------------------
    @abstractmethod
    def fragments(self) -> list[Fragment]:
        """Every fragment of every trainable parameter held on this rank."""

    def states_resident(self, write_back: bool):
        """A context in which the masters and optimizer state are host tensors (checkpoints);
        ``write_back``: what changed inside goes back where they live. Nothing to do unless
        they live in files (stage 3's NVMe offload)."""
        return contextlib.nullcontext()

    def grad_of(self, fragment: Fragment) -> torch.Tensor:
        """The reduced gradient laid out as ``fragment.master`` (tensor-fragment API's gradients)."""
        raise NotSupportedError(f"reading one parameter's gradient at {type(self).__name__}")

    def sync_params_from_master(self) -> None:
        """Refresh the model parameters from the masters (after a checkpoint load)."""
        self.after_optimizer_step()

    def full_shapes(self) -> dict[str, tuple[int, ...]]:
        """Parameter shapes by name where ``module.named_parameters()`` does not show them whole
        (stage 3 partitions the parameters themselves); empty where it does."""
        return {}

    def module_state_dict(self) -> dict[str, Any]:
        """The module's full state dict (stage 3 gathers here); called on every rank."""
        assert self.module is not None
        return self.module.state_dict()

    def load_module_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Load a full module state dict (buffers, frozen parameters and the model-dtype weights)."""
        assert self.module is not None
        self.module.load_state_dict(state, strict=strict)

    def gathered_16bit_state_dict(self) -> dict[str, Any] | None:
        """The module's state dict in its training dtype for ``save_16bit_model``; called on every
        rank. None when the config does not allow gathering it (stage 3 without
        ``stage3_gather_16bit_weights_on_model_save``): nothing is saved then."""
        return self.module_state_dict()

    def release_gathered(self) -> None:
        """Free parameters still gathered after a forward (``engine.empty_partition_cache``);
        only stage 3 gathers, so a no-op here."""

    def destroy(self) -> None:
        """Remove the hooks this strategy put on the module and its parameters (engine.destroy)."""
        for handle in self.hooks:
            handle.remove()
        if self.overlap is not None:
            self.overlap.close()

    # ---- reporting -----------------------------------------------------------------------
    def nvme_summary(self) -> str | None:
        """The start line of NVMe offload (stage 3 says where the states go); None without it."""
        return None

    def offloaded_numel(self) -> int:
        """Elements of this rank's masters whose optimizer step runs on the host's CPU Adam (optimizer
        offload to the CPU; not NVMe, whose bound is the disk): what the offload advice's bound counts."""
        return 0

    @abstractmethod
    def memory_breakdown(self) -> dict[str, int]:
        """Bytes this rank holds: keys ``parameters``, ``gradients``, ``master_weights``, ``optimizer_states``."""

    def optimizer_state_bytes(self) -> int:
        """Bytes of tensors in the optimizer's state (shared helper for memory_breakdown)."""
        if self.optimizer is None:
            return 0
        total = 0
        for state in self.optimizer.state.values():
            for value in state.values():
                if torch.is_tensor(value) and value.dim() > 0:
                    total += value.numel() * value.element_size()
        return total


#: the row length of ``square_sum``'s float32 partial norms (see there)
NORM_ROW = 1024


def square_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of squares of ``tensor``'s elements as a 0-dim float64 tensor, reading each element
    once: float32 norms of rows of NORM_ROW elements in one reduction (no copy of the tensor),
    squared and summed in float64.

    Why rows: a float32 norm of a whole gradient sums serially on the CPU (measured: 1e-3 relative
    error at 16M elements), and a float64 norm copies the gradient (torch casts float32 to float64
    before reducing, on the GPU too: 20 bytes moved an element instead of 4). Rows of 1024 keep
    each float32 sum short and their errors independent: within 1e-7 of a float64 sum on one row,
    1e-8 over millions of elements (bf16 training turns a 1e-7 change in the clip factor into a
    visibly different model within steps, so the norm must stay that close to DeepSpeed's). One
    code path for the CPU and the GPU. A norm past 1.8e19 overflows float32 squares to inf, as
    torch's clip_grad_norm_ does: such a step counts as an overflow."""
    flat = tensor.detach().contiguous().view(-1)   # rows are views: no copy of a contiguous gradient
    accumulate = torch.float32 if flat.element_size() < 4 else None   # 16-bit squares would overflow
    whole = flat.numel() - flat.numel() % NORM_ROW
    rows = torch.linalg.vector_norm(flat[:whole].view(-1, NORM_ROW), dim=1, dtype=accumulate)
    tail = torch.linalg.vector_norm(flat[whole:], dtype=accumulate).reshape(1)
    return torch.cat([rows, tail]).double().square().sum()


def squares_of(tensors, default_device: torch.device) -> torch.Tensor:
    """``square_sum`` over every non-empty tensor of ``tensors`` (None entries skipped), on the
    first one's device (``default_device`` when there is none)."""
    present = [t for t in tensors if t is not None and t.numel() > 0]
    total = torch.zeros((), dtype=torch.float64, device=present[0].device if present else default_device)
    for tensor in present:
        total = total + square_sum(tensor)
    return total


def stats_from_square_sum(total: torch.Tensor) -> GradStats:
    """GradStats from a (summed over ranks) square-sum tensor: one host sync."""
    squared = float(total)
    overflow = not math.isfinite(squared)
    return GradStats(norm=float("inf") if overflow else math.sqrt(max(0.0, squared)), overflow=overflow)


class DeviceNorm:
    """A step's global gradient norm kept as its square-sum tensor until read (``value()``: one
    host sync then, none before): ``engine.get_global_grad_norm()`` of a sync-free step."""

    __slots__ = ("total", "_value")

    def __init__(self, total: torch.Tensor):
        self.total, self._value = total, None

    def value(self) -> float:
        if self._value is None:
            self._value = stats_from_square_sum(self.total).norm
        return self._value


def clip_coefficient(norm: float, clip: float) -> float:
    """``gradient_clipping``: how far the unscaled global ``norm`` exceeds ``clip``, at least 1
    (the grads are divided by it); 1 without clipping (``clip`` 0)."""
    return max(1.0, (norm + 1e-6) / clip) if clip > 0 else 1.0


def unscale_and_clip_factor(norm: "float | DeviceNorm", scale: float, clip: float) -> "float | torch.Tensor":
    """What a step multiplies the master grads by: unscaling (1 / the loss ``scale``) and clipping
    (1 / ``clip_coefficient``) in one pass, as DeepSpeed fuses them, for the unscaled global
    ``norm``; 0 when it is infinite. A DeviceNorm gives a device tensor (``clip_factor``, no host
    sync), a float norm a float."""
    if isinstance(norm, DeviceNorm):
        return clip_factor(norm.total, scale, clip) if clip > 0 or scale != 1.0 else 1.0
    return 1.0 / (scale * clip_coefficient(norm, clip))


def clip_factor(total: torch.Tensor, scale: float, clip: float) -> torch.Tensor:
    """The step's gradient factor from a square-sum tensor, computed on its device (no sync),
    as the engine's float path computes it: 1 / (scale * max(1, (norm / scale + 1e-6) / clip)),
    and 0 when the norm is not finite (that path's infinite norm); 1 / scale without clipping."""
    if clip <= 0:
        return torch.full_like(total, 1.0 / scale)
    norm = total.sqrt() / scale
    coefficient = torch.clamp((norm + 1e-6) / clip, min=1.0)   # clip_coefficient on the device
    factor = 1.0 / (scale * coefficient)
    return torch.where(torch.isfinite(norm), factor, torch.zeros_like(factor))


# ---- registry -----------------------------------------------------------------------------
STRATEGIES: dict[tuple[int, bool], Any] = {
    (0, False): "launcher.zero.stages.stage0:Stage0Strategy",
    (1, False): "launcher.zero.stages.stage1:Stage1Strategy",
    (2, False): "launcher.zero.stages.stage2:Stage2Strategy",
    (3, False): "launcher.zero.stages.stage3:Stage3Strategy",
    (1, True): "launcher.zero.stages.offload:Stage1OffloadStrategy",
    (2, True): "launcher.zero.stages.offload:Stage2OffloadStrategy",
    (3, True): "launcher.zero.stages.stage3:Stage3Strategy",
}


def register_strategy(stage: int, strategy: Any, *, offload: bool = False) -> None:
    """Register a strategy class (or a lazy "module:Class" string) for a stage."""
    STRATEGIES[(int(stage), bool(offload))] = strategy


def resolve_strategy(stage: int, offload: bool = False) -> type[ZeroStrategy]:
    """The strategy class for a stage; a stage whose module is missing is a ConfigError."""
    entry = STRATEGIES.get((stage, offload))
    if entry is None:
        raise ConfigError(
            f"zero_optimization.stage: no strategy for stage {stage}"
            + (" with offload_optimizer" if offload else ""),
            hint="use stage 0, 1, 2 or 3",
        )
    if isinstance(entry, str):
        module_name, _, class_name = entry.partition(":")
        try:
            module = importlib.import_module(module_name)
            entry = getattr(module, class_name)
        except (ImportError, AttributeError) as error:
            raise ConfigError(
                f"zero_optimization.stage: stage {stage}" + (" with offload" if offload else "")
                + f" is not available in this build ({error})",
                hint="use a stage without offload, or install a build that has it",
            ) from error
        STRATEGIES[(stage, offload)] = entry
    return entry
