"""The process groups of a topology (DeepSpeed's ``PipelineParallelGrid``), built on every rank.

``torch.distributed.new_group`` is collective over the whole world, so every rank creates every
group of every axis in the same order and keeps the ones it belongs to.
"""
from __future__ import annotations

import torch.distributed as dist

from launcher.zero.parallel.topology import ProcessTopology


class ParallelGrid:
    """This rank's coordinates and its pipe / data / model (tensor) groups in ``topology``."""

    def __init__(self, topology: ProcessTopology, global_rank: int | None = None):
        self._topo = topology
        self.global_rank = dist.get_rank() if global_rank is None else global_rank
        self.world_size = topology.world_size()
        coord = topology.get_coord(self.global_rank)
        self.stage_id = getattr(coord, "pipe", 0)
        self.data_parallel_id = getattr(coord, "data", 0)
        self.model_parallel_id = getattr(coord, "model", 0)
        self.pipe_parallel_size = max(1, topology.get_dim("pipe"))
        self.data_parallel_size = max(1, topology.get_dim("data"))
        self.model_parallel_size = max(1, topology.get_dim("model"))
        self.groups = {axis: self._own_group(axis) for axis in ("pipe", "data", "model")}

    def _own_group(self, axis: str):
        """Create every group along ``axis``; return (ranks, group) of the one holding this rank."""
        lists = self._topo.get_axis_comm_lists(axis) or [[rank] for rank in range(self.world_size)]
        mine = None
        for ranks in lists:
            group = dist.new_group(ranks=ranks)
            if self.global_rank in ranks:
                mine = (ranks, group)
        return mine

    def topology(self) -> ProcessTopology:
        return self._topo

    def stage_to_global(self, stage_id: int, **kwargs: int) -> int:
        """The global rank of ``stage_id`` at this rank's other coordinates (overridable by kwargs)."""
        coord = self._topo.get_coord(self.global_rank)._asdict()
        coord.update(pipe=stage_id, **kwargs)
        return self._topo.get_rank(**coord)

    def get_global_rank(self) -> int:
        return self.global_rank

    # pipeline axis
    def get_stage_id(self) -> int:
        return self.stage_id

    def get_pipe_parallel_rank(self) -> int:
        return self.stage_id

    def get_pipe_parallel_world_size(self) -> int:
        return self.pipe_parallel_size

    def get_pipe_parallel_group(self):
        return self.groups["pipe"][1]

    def get_pipe_parallel_ranks(self) -> list[int]:
        return list(self.groups["pipe"][0])

    # data axis
    def get_data_parallel_rank(self) -> int:
        return self.data_parallel_id

    def get_data_parallel_world_size(self) -> int:
        return self.data_parallel_size

    def get_data_parallel_group(self):
        return self.groups["data"][1]

    def get_data_parallel_ranks(self) -> list[int]:
        return list(self.groups["data"][0])

    # tensor ("model", DeepSpeed's slice) axis; mpu names answer for it
    def get_slice_parallel_rank(self) -> int:
        return self.model_parallel_id

    def get_slice_parallel_world_size(self) -> int:
        return self.model_parallel_size

    def get_slice_parallel_group(self):
        return self.groups["model"][1]

    get_model_parallel_rank = get_tensor_model_parallel_rank = get_slice_parallel_rank
    get_model_parallel_world_size = get_tensor_model_parallel_world_size = get_slice_parallel_world_size
    get_model_parallel_group = get_tensor_model_parallel_group = get_slice_parallel_group
