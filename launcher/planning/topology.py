"""The 3D layout of a job (pipeline x data x tensor ranks) as the dry-run prints it. Pure.

The rank order is the engine's (``launcher/zero/parallel/topology.py``, DeepSpeed's
``PipeModelDataParallelTopology``): rank = (stage x data_size + data index) x tensor + tensor
index, so a tensor-parallel group is consecutive ranks (one node) and stages are outermost
(across nodes). Kept here as three lines of arithmetic because planning imports nothing of the
engine; ``tests/unit/launcher/test_plan_topology.py`` holds the two to the same answer.
"""
from __future__ import annotations

from dataclasses import dataclass

from launcher.errors import ConfigError


@dataclass(frozen=True)
class Layout:
    """Sizes of the three axes and every group, as lists of global ranks."""

    pipe: int
    data: int
    tensor: int
    groups: dict          # axis -> list of rank lists ("pipe", "data", "tensor")

    def to_json(self, host_of: dict[int, str]) -> dict:
        return {"pipe": self.pipe, "data": self.data, "tensor": self.tensor,
                "groups": {axis: [{"ranks": ranks, "hosts": sorted({host_of[r] for r in ranks})} for ranks in lists]
                           for axis, lists in self.groups.items()}}


def _rank(stage: int, data_index: int, tensor_index: int, data: int, tensor: int) -> int:
    return (stage * data + data_index) * tensor + tensor_index


def build_layout(world_size: int, pipe: int, tensor: int, source: str = "config") -> Layout:
    """The layout of ``world_size`` ranks; sizes that do not divide the world are a ConfigError."""
    for key, size in (("pipeline.stages", pipe), ("tensor_parallel.autotp_size", tensor)):
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(f"{source}: {key} = {size!r} is not an integer >= 1", hint=None)
    if world_size % (pipe * tensor):
        raise ConfigError(f"{source}: pipeline {pipe} x tensor {tensor} = {pipe * tensor} does not divide the "
                          f"world of {world_size} ranks",
                          hint=f"launch a multiple of {pipe * tensor} ranks, or change the sizes")
    data = world_size // (pipe * tensor)
    groups = {
        "tensor": [[_rank(s, d, t, data, tensor) for t in range(tensor)] for s in range(pipe) for d in range(data)],
        "data": [[_rank(s, d, t, data, tensor) for d in range(data)] for s in range(pipe) for t in range(tensor)],
        "pipe": [[_rank(s, d, t, data, tensor) for s in range(pipe)] for d in range(data) for t in range(tensor)],
    }
    return Layout(pipe=pipe, data=data, tensor=tensor, groups=groups)


def check_tensor_groups_within_nodes(layout: Layout, host_of: dict[int, str], source: str = "config") -> None:
    """A tensor-parallel group talks every layer: one spanning two nodes is refused."""
    for ranks in layout.groups["tensor"]:
        hosts = sorted({host_of[r] for r in ranks})
        if len(hosts) > 1:
            raise ConfigError(f"{source}: tensor-parallel group {ranks} would span hosts {', '.join(hosts)}",
                              hint=f"use a tensor size that divides every node's slots "
                                   f"(tensor_parallel.autotp_size = {layout.tensor})")


def describe_layout(layout: Layout, host_of: dict[int, str]) -> str:
    """Text for ``--dry-run``: the sizes, then which global ranks form each group, on which hosts."""
    lines = [f"topology: pipe {layout.pipe} x data {layout.data} x tensor {layout.tensor} "
             "(tensor innermost, stages outermost)"]
    for axis in ("pipe", "data", "tensor"):
        for ranks in layout.groups[axis]:
            hosts = ",".join(dict.fromkeys(host_of[r] for r in ranks))
            lines.append(f"  {axis:<6} group ranks {ranks} on {hosts}")
    return "\n".join(lines)


def sizes_from_sections(pipeline: object, tensor_parallel: object) -> tuple[int, int]:
    """(pipe, tensor) from the config's ``pipeline.stages`` and ``tensor_parallel.autotp_size``."""
    pipe = pipeline.get("stages", 1) if isinstance(pipeline, dict) else 1
    tensor = tensor_parallel.get("autotp_size", 1) if isinstance(tensor_parallel, dict) else 1
    return (1 if pipe in ("auto", None) else pipe), (1 if tensor in (0, None) else tensor)
