"""Which ranks exchange tokens and which ranks average expert gradients: pure, no torch, no I/O.

Expert parallelism splits the data axis of a process topology. Every data group (ranks that share
pipe and tensor coordinates) is cut into blocks of ``ep_size`` ranks:

* an **expert group** is one block: its ranks hold different experts of a layer and exchange
  tokens with an all-to-all;
* an **expert-data group** is the ranks at the same position of every block: they hold the same
  experts, so expert gradients are averaged over them (the rest over the whole data group).

With 8 data ranks and ``ep_size`` 2 (DeepSpeed's "E + D" order): expert groups
``[0,1] [2,3] [4,5] [6,7]``, expert-data groups ``[0,2,4,6] [1,3,5,7]``. DeepSpeed's
``use_data_before_expert_parallel_`` ("D + E") swaps the roles: blocks are the expert-data groups
and the strided sets the expert groups.
"""
from __future__ import annotations

from dataclasses import dataclass

from launcher.zero.errors import ConfigError, NotSupportedError


def expert_group_name(ep_size: int) -> str:
    """The name DeepSpeed gives the groups of one expert-parallel size (``param.group_name``)."""
    return f"ep_size_{ep_size}"


@dataclass(frozen=True)
class ExpertTopology:
    """Every expert group and expert-data group of one ``ep_size``, as lists of global ranks."""

    ep_size: int
    expert_groups: tuple[tuple[int, ...], ...]
    expert_data_groups: tuple[tuple[int, ...], ...]

    @property
    def name(self) -> str:
        return expert_group_name(self.ep_size)

    def expert_group_of(self, rank: int) -> tuple[int, ...]:
        return _holding(self.expert_groups, rank)

    def expert_data_group_of(self, rank: int) -> tuple[int, ...]:
        return _holding(self.expert_data_groups, rank)

    def expert_rank(self, rank: int) -> int:
        """The position of ``rank`` in its expert group: it holds experts
        ``[expert_rank * num_local_experts, (expert_rank + 1) * num_local_experts)``."""
        return self.expert_group_of(rank).index(rank)


def _holding(groups, rank: int) -> tuple[int, ...]:
    for ranks in groups:
        if rank in ranks:
            return ranks
    raise ConfigError(f"expert topology: rank {rank} is in none of the groups {list(groups)}",
                      hint="the rank must be inside the world the topology was built for")


def expert_topology(topology, ep_size: int, data_before_expert: bool = False) -> ExpertTopology:
    """The expert and expert-data groups of ``ep_size`` over ``topology``'s data axis.

    ``topology`` is a ``ProcessTopology`` (anything with ``get_dim`` and ``get_axis_comm_lists``).
    An ``ep_size`` that does not divide the data-parallel size is a ConfigError naming both.
    """
    if not isinstance(ep_size, int) or isinstance(ep_size, bool) or ep_size < 1:
        raise ConfigError(f"MoE: ep_size {ep_size!r} is not an integer >= 1", hint="ep_size is the number of "
                          "ranks one layer's experts are spread over; 1 keeps every expert on every rank")
    world_size = topology.world_size()
    tensor = max(1, topology.get_dim("model"))
    pipe = max(1, topology.get_dim("pipe"))
    if tensor > 1:
        raise NotSupportedError("MoE with tensor parallelism (expert groups over a topology with tensor size "
                                f"{tensor}) is not supported by dslaunch's engine yet",
                                hint="use tensor size 1 with MoE layers, or run the script with DeepSpeed")
    data_groups = topology.get_axis_comm_lists("data") or [list(range(world_size))]
    data_size = len(data_groups[0])
    if data_size % ep_size:
        raise ConfigError(f"MoE: ep_size {ep_size} does not divide the data-parallel size {data_size} "
                          f"(world {world_size} = pipe {pipe} x data {data_size} x tensor {tensor})",
                          hint=f"choose an ep_size that divides {data_size}, e.g. "
                               f"{', '.join(str(d) for d in _divisors(data_size))}")
    expert_groups, expert_data_groups = [], []
    for ranks in data_groups:
        if data_before_expert:      # D + E: consecutive ranks share experts, strided ones exchange tokens
            sharing, exchanging = _blocks_and_strides(ranks, data_size // ep_size)
        else:                       # E + D: consecutive ranks exchange tokens, strided ones share experts
            exchanging, sharing = _blocks_and_strides(ranks, ep_size)
        expert_groups += exchanging
        expert_data_groups += sharing
    return ExpertTopology(ep_size, tuple(expert_groups), tuple(expert_data_groups))


def _blocks_and_strides(ranks, block: int):
    """``ranks`` cut into consecutive blocks of ``block``, and the sets at each position of every block."""
    blocks = [tuple(ranks[start:start + block]) for start in range(0, len(ranks), block)]
    return blocks, [tuple(b[i] for b in blocks) for i in range(block)]


def _divisors(number: int) -> list[int]:
    return [d for d in range(1, number + 1) if number % d == 0]


def check_experts_divide(num_experts: int, ep_size: int) -> None:
    """``num_experts`` must split evenly over the ``ep_size`` ranks of an expert group."""
    if not isinstance(num_experts, int) or isinstance(num_experts, bool) or num_experts < 1:
        raise ConfigError(f"MoE: num_experts {num_experts!r} is not an integer >= 1", hint=None)
    if not isinstance(ep_size, int) or isinstance(ep_size, bool) or ep_size < 1:
        raise ConfigError(f"MoE: ep_size {ep_size!r} is not an integer >= 1", hint=None)
    if num_experts % ep_size:
        raise ConfigError(f"MoE: ep_size {ep_size} does not divide num_experts {num_experts}",
                          hint=f"each of the {ep_size} ranks of an expert group holds num_experts / ep_size "
                               f"experts; choose an ep_size among {_divisors(num_experts)}")
