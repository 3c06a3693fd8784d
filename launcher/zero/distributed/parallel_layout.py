"""The parallel layout: every parallel degree of the job and this rank's process group on each axis.

One object, built and validated once at ``zero.initialize`` (``layout_from_mpu``, ``check_config``),
then carried by the strategy context (``StrategyContext.parallel``). A collective asks it for its
group instead of knowing which object holds it::

    layout.group("data")              ZeRO's partitions and its gradient reduction
    layout.group("tensor")            the tensor-parallel shards (Megatron's model-parallel group)
    layout.group("pipe")              the pipeline's stages at this rank's data and tensor coordinates
    layout.group("sequence")          the sequence-parallel group (``mpu.get_sequence_parallel_group``)
    layout.expert_data("ep_size_2")   the ranks holding the same experts of one ``ep_size``

``context(axis)`` is the axis as a ``DistContext`` (this rank's rank and size on it, the process's
device), so code that took the data-parallel context takes any axis; ``size(axis)`` and
``rank(axis)`` are its degree and this rank's place. A group of None is torch's default group; an
axis of size 1 is this rank alone and needs no collective. DeepSpeed's duck-typed ``mpu`` (and the
pipeline's ``ParallelGrid``, one too) is read here once; nothing below asks it again.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

import torch.distributed as dist

from launcher.zero.distributed.context import DistContext, context_from_group
from launcher.zero.errors import ConfigError

#: the axes a layout answers for; every one is present (size 1 when the job does not split on it)
AXES = ("data", "tensor", "pipe", "sequence")

#: what ``zero.initialize(mpu=...)`` needs of an mpu (the rest it reads when present)
MPU_METHODS = ("get_data_parallel_group", "get_data_parallel_world_size", "get_model_parallel_group",
               "get_model_parallel_world_size")


@dataclass(frozen=True)
class TensorParallelInfo:
    """This rank's place on the tensor axis (``zero.initialize(mpu=)``), and how its shards split."""

    rank: int = 0
    size: int = 1
    partition_dims: tuple = ()        # (parameter name, dim) for every tensor-parallel shard


def solo_context(world: DistContext) -> DistContext:
    """An axis this job does not split on: this rank alone (no collective runs over it)."""
    return dataclasses.replace(world, group=None, rank=0, world_size=1)


@dataclass(frozen=True)
class ParallelLayout:
    """The degrees and groups of the data, tensor, pipe and sequence axes, and the expert-data groups.

    ``world``: the whole job (its rank, device, backend). ``axes``: axis name -> this rank's context
    over that axis (an axis left out is ``solo_context(world)``). ``experts``: ``ep_size_<N>`` -> the
    context over that size's expert-data ranks (MoE; empty without). ``tensor_partition_dims``:
    ``(parameter name, dim)`` of every tensor-parallel shard. Checked when built: an unknown axis or
    expert name, a size below 1 or a rank outside its axis is a ConfigError naming it.
    """

    world: DistContext
    axes: Mapping[str, DistContext] = field(default_factory=dict)
    experts: Mapping[str, DistContext] = field(default_factory=dict)
    tensor_partition_dims: tuple = ()

    def __post_init__(self) -> None:
        unknown = sorted(set(self.axes) - set(AXES))
        if unknown:
            raise ConfigError(f"parallel layout: unknown axis {unknown[0]!r}", hint=f"the axes are {', '.join(AXES)}")
        axes = {axis: self.axes.get(axis) or solo_context(self.world) for axis in AXES}
        for name, context in [*axes.items(), *self.experts.items()]:
            _check_axis(name, context)
        for name in self.experts:
            if not name.startswith("ep_size_"):
                raise ConfigError(f"parallel layout: expert-data group {name!r} is not named ep_size_<N>",
                                  hint="name expert groups as DeepSpeed does: ep_size_<ep_size>")
        object.__setattr__(self, "axes", MappingProxyType(axes))
        object.__setattr__(self, "experts", MappingProxyType(dict(self.experts)))

    # ---- lookup --------------------------------------------------------------------------------
    def context(self, axis: str) -> DistContext:
        """This rank's context over ``axis`` (one of ``AXES``)."""
        try:
            return self.axes[axis]
        except KeyError:
            raise ConfigError(f"parallel layout: no axis {axis!r}", hint=f"the axes are {', '.join(AXES)}") from None

    def group(self, axis: str) -> Any:
        """The process group of ``axis`` that holds this rank (None: torch's default group)."""
        return self.context(axis).group

    def size(self, axis: str) -> int:
        """The degree of ``axis``: how many ranks share this rank's group on it."""
        return self.context(axis).world_size

    def rank(self, axis: str) -> int:
        """This rank's place in its group on ``axis``."""
        return self.context(axis).rank

    def expert_data(self, name: str) -> DistContext:
        """The context over the ranks holding the same experts of ``name`` (``ep_size_<N>``)."""
        try:
            return self.experts[name]
        except KeyError:
            raise ConfigError(f"parallel layout: no expert-data group {name!r} (known: {sorted(self.experts)})",
                              hint="expert groups exist for the ep_size of the model's MoE layers") from None

    def param_group_context(self, param_group: dict) -> DistContext:
        """The ranks an optimizer param group is reduced and partitioned over: a ``moe: True`` group named
        after an expert group over its expert-data ranks, every other group over the data axis."""
        if param_group.get("moe", False) and param_group.get("name") in self.experts:
            return self.experts[param_group["name"]]
        return self.axes["data"]

    # ---- derived views -------------------------------------------------------------------------
    @property
    def data(self) -> DistContext:
        """The data-parallel axis (what ZeRO partitions over): ``context("data")``."""
        return self.axes["data"]

    @property
    def tensor_parallel(self) -> TensorParallelInfo:
        """The tensor axis as checkpoints record it (rank, size, partition dims)."""
        return TensorParallelInfo(rank=self.rank("tensor"), size=self.size("tensor"),
                                  partition_dims=self.tensor_partition_dims)

    @property
    def tensor_sharded_names(self) -> frozenset[str]:
        """The parameters split over the tensor axis (their squares are summed over it in the norm)."""
        return frozenset(name for name, _ in self.tensor_partition_dims)

    def with_parts(self, **changes) -> "ParallelLayout":
        """A copy with ``experts`` or ``tensor_partition_dims`` filled in (checked again)."""
        return dataclasses.replace(self, **changes)

    def check_config(self, sections: Mapping[str, Any]) -> None:
        """The config's own parallel degrees against this layout: ``tensor_parallel.autotp_size``
        (DeepSpeed's AutoTP key) must match the tensor size actually used.

        This engine does not slice a model by itself: a size > 1 without a matching ``mpu`` (or grid)
        is an error rather than a silent run without tensor parallelism."""
        check_autotp_size(sections, self.size("tensor"))


def _check_axis(name: str, context: DistContext) -> None:
    if not isinstance(context, DistContext):
        raise ConfigError(f"parallel layout: axis {name!r} is a {type(context).__name__}, not a DistContext",
                          hint="build the layout with layout_from_mpu or single_axis_layout")
    if context.world_size < 1 or not 0 <= context.rank < context.world_size:
        raise ConfigError(f"parallel layout: axis {name!r} has rank {context.rank} of size {context.world_size}",
                          hint="a rank lies in [0, size) and every size is at least 1")


def check_autotp_size(sections: Mapping[str, Any], tensor_size: int) -> None:
    """``tensor_parallel.autotp_size`` in ``sections`` (0, 1 or absent: not asked) must be ``tensor_size``."""
    section = sections.get("tensor_parallel") or {}
    size = section.get("autotp_size", 0) if isinstance(section, dict) else 0
    if size in (0, 1, None) or size == tensor_size:
        return
    raise ConfigError(f"tensor_parallel.autotp_size is {size} but the model runs with tensor-parallel size "
                      f"{tensor_size}", hint="split the model with launcher.zero.parallel.tensor.apply_tensor_parallel "
                      "and pass mpu=ParallelGrid(topology_for(world_size, model=N)) (no automatic slicing here)")


def single_axis_layout(data: DistContext) -> ParallelLayout:
    """Data parallelism alone over ``data`` (no mpu): every other axis is this rank alone."""
    return ParallelLayout(world=data, axes={"data": data})


def layout_from_mpu(world: DistContext, mpu=None) -> ParallelLayout:
    """The layout of a job: data parallelism over ``world`` alone, or DeepSpeed's ``mpu`` read once.

    ZeRO then runs over the mpu's data-parallel group; its model-parallel group is the tensor axis,
    and its pipe and sequence groups (read when the mpu has them) the pipe and sequence axes. An mpu
    missing one of ``MPU_METHODS`` is a ConfigError naming them."""
    if mpu is None:
        return single_axis_layout(world)
    missing = [name for name in MPU_METHODS if not callable(getattr(mpu, name, None))]
    if missing:
        raise ConfigError(f"zero.initialize: mpu lacks {', '.join(missing)}",
                          hint="pass an object with get_(data|model)_parallel_(rank|world_size|group), "
                               "e.g. launcher.zero.parallel.ParallelGrid(topology)")
    axes = {"data": _over(world, mpu.get_data_parallel_group()), "tensor": _tensor_axis(world, mpu),
            "pipe": _optional_axis(world, mpu, "pipe"), "sequence": _optional_axis(world, mpu, "sequence")}
    return ParallelLayout(world=world, axes=axes)


def _over(world: DistContext, group) -> DistContext:
    """``world``'s process facts (device, local rank) over ``group``."""
    return context_from_group(group, device=world.device, local_rank=world.local_rank,
                              local_world_size=world.local_world_size)


def _optional_axis(world: DistContext, mpu, name: str) -> DistContext:
    """The mpu's ``get_<name>_parallel_(world_size|group)`` axis; this rank alone where it has none."""
    size_of, group_of = (getattr(mpu, f"get_{name}_parallel_{what}", None) for what in ("world_size", "group"))
    if not (callable(size_of) and callable(group_of)) or size_of() <= 1:
        return solo_context(world)
    return _over(world, group_of())


def _tensor_axis(world: DistContext, mpu) -> DistContext:
    """The mpu's model-parallel axis; its rank from ``get_model_parallel_rank`` where the mpu has one."""
    size, group = mpu.get_model_parallel_world_size(), mpu.get_model_parallel_group()
    if size <= 1:
        return solo_context(world)
    rank = mpu.get_model_parallel_rank() if callable(getattr(mpu, "get_model_parallel_rank", None)) \
        else dist.get_rank(group=group)
    return dataclasses.replace(world, group=group, rank=rank, world_size=size)


def tensor_partition_dims(module) -> tuple:
    """``(parameter name, dim)`` of every tensor-parallel shard of ``module`` (``tensor_model_parallel``)."""
    return tuple((name, int(param.partition_dim)) for name, param in module.named_parameters()
                 if getattr(param, "tensor_model_parallel", False))
