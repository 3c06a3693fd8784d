"""The process topology: every global rank's coordinates on named axes (DeepSpeed's names).

Pure (no torch, no I/O), so the launcher's dry-run can print it. Axes are listed slowest-varying
first: ``ProcessTopology(["pipe", "data", "model"], [2, 2, 2])`` numbers ranks pipe-major and puts
the ``model`` (tensor-parallel) axis innermost, so a tensor-parallel group is consecutive ranks,
which the launcher places on one node.
"""
from __future__ import annotations

from collections import namedtuple
from itertools import product

from launcher.zero.distributed import parallel_layout
from launcher.zero.errors import ConfigError

#: the config's AutoTP size against the tensor size used; the parallel layout checks it now
check_autotp_size = parallel_layout.check_autotp_size


class ProcessTopology:
    """A row-major map between global ranks and coordinates on ``axes`` of sizes ``dims``."""

    def __init__(self, axes: list[str], dims: list[int]):
        if len(axes) != len(dims) or len(set(axes)) != len(axes):
            raise ConfigError(f"topology: axes {axes} and dims {dims} must pair up, with unique names", hint=None)
        for axis, dim in zip(axes, dims):
            if not isinstance(dim, int) or dim < 1:
                raise ConfigError(f"topology: axis '{axis}' has size {dim!r}", hint="every axis size is an integer >= 1")
        self.axes = list(axes)
        self.dims = list(dims)
        self.ProcessCoord = namedtuple("ProcessCoord", self.axes)
        self.mapping = {self.ProcessCoord(*coord): rank
                        for rank, coord in enumerate(product(*(range(d) for d in self.dims)))}
        self._coords = {rank: coord for coord, rank in self.mapping.items()}

    def world_size(self) -> int:
        return len(self.mapping)

    def get_dim(self, axis: str) -> int:
        """The size of ``axis`` (0 when the topology has no such axis, as in DeepSpeed)."""
        return self.dims[self.axes.index(axis)] if axis in self.axes else 0

    def get_rank(self, **coords: int) -> int:
        """The global rank at the given coordinates; every axis must be named."""
        if set(coords) != set(self.axes):
            raise ConfigError(f"topology.get_rank: give every axis of {self.axes}, got {sorted(coords)}", hint=None)
        key = self.ProcessCoord(**coords)
        if key not in self.mapping:
            raise ConfigError(f"topology.get_rank: {coords} is outside the dims {dict(zip(self.axes, self.dims))}",
                              hint=None)
        return self.mapping[key]

    def get_coord(self, rank: int):
        """The coordinates of ``rank`` as a named tuple (``coord.pipe``, ``coord.data``, ...)."""
        if rank not in self._coords:
            raise ConfigError(f"topology.get_coord: rank {rank} is outside a world of {self.world_size()}", hint=None)
        return self._coords[rank]

    def get_axis_names(self) -> list[str]:
        return list(self.axes)

    def get_rank_repr(self, rank: int, omit_axes=("data", "pipe"), inner_sep: str = "_", outer_sep: str = "-") -> str:
        """A string naming ``rank`` by its coordinates, e.g. ``model_01`` (used in file names)."""
        coord = self.get_coord(rank)
        return outer_sep.join(f"{axis}{inner_sep}{getattr(coord, axis):02d}"
                              for axis in self.axes if axis not in omit_axes)

    def get_axis_list(self, axis: str, idx: int) -> list[int]:
        """The ranks whose coordinate on ``axis`` is ``idx``."""
        if axis not in self.axes:
            return []
        position = self.axes.index(axis)
        return sorted(rank for coord, rank in self.mapping.items() if coord[position] == idx)

    def filter_match(self, **filter_kwargs: int) -> list[int]:
        """The ranks whose coordinates match every ``axis=value`` given."""
        return sorted(rank for coord, rank in self.mapping.items()
                      if all(getattr(coord, axis) == value for axis, value in filter_kwargs.items()))

    def get_axis_comm_lists(self, axis: str) -> list[list[int]]:
        """The communication groups along ``axis``: ranks that differ only in their ``axis`` coordinate.

        Listed in the order of the other axes' coordinates, so every rank builds them identically.
        """
        if axis not in self.axes:
            return []
        others = [a for a in self.axes if a != axis]
        lists = []
        for fixed in product(*(range(self.get_dim(a)) for a in others)):
            where = dict(zip(others, fixed))
            lists.append([self.get_rank(**where, **{axis: i}) for i in range(self.get_dim(axis))])
        return lists

    def __str__(self) -> str:
        return f"ProcessTopology({dict(zip(self.axes, self.dims))})"


class PipeDataParallelTopology(ProcessTopology):
    """Pipeline x data parallelism; rank = stage x num_dp + data index (DeepSpeed's order)."""

    def __init__(self, num_pp: int, num_dp: int):
        super().__init__(axes=["pipe", "data"], dims=[num_pp, num_dp])


class PipeModelDataParallelTopology(ProcessTopology):
    """3D: pipeline outermost (across nodes), then data, tensor (``model``) innermost (within a node)."""

    def __init__(self, num_pp: int, num_mp: int, num_dp: int):
        super().__init__(axes=["pipe", "data", "model"], dims=[num_pp, num_dp, num_mp])


def topology_for(world_size: int, pipe: int = 1, model: int = 1) -> ProcessTopology:
    """The 3D topology of ``world_size`` ranks; sizes that do not divide the world are a ConfigError."""
    for name, size in (("pipeline", pipe), ("tensor", model)):
        if not isinstance(size, int) or size < 1:
            raise ConfigError(f"{name} parallel size {size!r} is not an integer >= 1", hint=None)
    if world_size % (pipe * model):
        raise ConfigError(f"pipeline {pipe} x tensor {model} = {pipe * model} does not divide the world of "
                          f"{world_size} ranks", hint="choose sizes whose product divides the number of ranks")
    return PipeModelDataParallelTopology(num_pp=pipe, num_mp=model, num_dp=world_size // (pipe * model))
