"""Rank-side expert parallelism check: the MoE layer at ep_size N against the same layer at ep 1.

argv: ep_size. Every rank builds both layers from one seed and runs its own tokens through each
with the same draws. The ep layer holds num_experts / N experts and exchanges tokens over its
expert group. Per case one ``RESULT {json}`` line with the max abs differences of outputs,
``l_aux``, and the relative ones of input and gate gradients, and of expert gradients: an ep layer's expert gets the
gradient of every rank of its group, so it must equal the ep 1 gradients summed over that group;
summed further over the expert-data group it must equal the sum over the whole world.
"""
import json
import os
import sys

import torch
import torch.distributed as dist

from launcher.zero.experts import MoE, expert_topology, new_expert_groups
from launcher.zero.parallel.topology import topology_for

HIDDEN, EXPERTS = 6, 4
CASES = {   # name: (layer arguments, tokens of rank r)
    "top1 RSample, drops": (dict(k=1, noisy_gate_policy="RSample", capacity_factor=0.5), lambda r: 24),
    "top1 no drop, uneven tokens": (dict(k=1, drop_tokens=False), lambda r: 16 + 4 * r),
    "top2 sampled, drops": (dict(k=2, capacity_factor=0.75), lambda r: 24),
    "top2 no drop, uneven tokens": (dict(k=2, drop_tokens=False), lambda r: 16 + 4 * r),
    "top3 drops, jitter": (dict(k=3, capacity_factor=0.5, noisy_gate_policy="Jitter", min_capacity=0), lambda r: 24),
    "top1 residual": (dict(k=1, use_residual=True), lambda r: 24),
}


def build(arguments: dict, ep_size: int, group=None, first_expert: int = 0) -> MoE:
    """The layer from seed 0; its local experts are global ``first_expert``, ``first_expert + 1``..."""
    torch.manual_seed(0)
    expert = torch.nn.Sequential(torch.nn.Linear(HIDDEN, 12), torch.nn.GELU(), torch.nn.Linear(12, HIDDEN))
    layer = MoE(HIDDEN, expert, num_experts=EXPERTS, ep_size=ep_size, ep_group=group, **arguments)
    with torch.no_grad():      # make the experts differ (they start as copies), alike at any ep_size
        for index, local in enumerate(layer.deepspeed_moe.experts.deepspeed_experts):
            for param in local.parameters():
                param.add_(0.05 * (first_expert + index))
    return layer


def run(layer: MoE, tokens: torch.Tensor, seed: int):
    tokens = tokens.clone().requires_grad_(True)
    torch.manual_seed(seed)
    output, l_aux, exp_counts = layer(tokens)
    (output.square().sum() + l_aux).backward()
    return output.detach(), l_aux.item(), exp_counts.tolist(), tokens.grad


def relative(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """Max abs difference over the reference's max abs value (gradients here reach the tens)."""
    return float((ours - reference).abs().max() / reference.abs().max().clamp(min=1e-12))


def expert_grads(layer: MoE) -> torch.Tensor:
    experts = layer.deepspeed_moe.experts.deepspeed_experts
    return torch.stack([torch.cat([p.grad.flatten() for p in local.parameters()]) for local in experts])


def main():
    ep_size = int(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    topology = expert_topology(topology_for(world_size), ep_size)
    groups = new_expert_groups(topology, rank)
    local = slice(topology.expert_rank(rank) * EXPERTS // ep_size, (topology.expert_rank(rank) + 1) * EXPERTS // ep_size)
    for name, (arguments, tokens_of) in CASES.items():
        tokens = torch.randn(tokens_of(rank), HIDDEN, generator=torch.Generator().manual_seed(100 + rank))
        plain, spread = build(arguments, 1), build(arguments, ep_size, groups.expert_group, local.start)
        out1, aux1, counts1, grad1 = run(plain, tokens, seed=7 + rank)
        out2, aux2, counts2, grad2 = run(spread, tokens, seed=7 + rank)
        plain_experts, spread_experts = expert_grads(plain), expert_grads(spread)
        over_group = plain_experts.clone()
        dist.all_reduce(over_group, group=groups.expert_group)           # what each expert receives
        over_world = plain_experts.clone()
        dist.all_reduce(over_world)                                       # data-parallel sum at ep 1
        over_data = spread_experts.clone()
        dist.all_reduce(over_data, group=groups.expert_data_group)       # the engine's reduction at ep N
        record = {"case": name, "rank": rank, "ep_size": ep_size, "same_counts": counts1 == counts2,
                  "tokens_all_dropped": int((out1.abs().sum(1) == 0).sum()),
                  "output": float((out1 - out2).abs().max()), "l_aux": abs(aux1 - aux2),
                  "input_grad": relative(grad2, grad1),
                  "gate_grad": relative(spread.deepspeed_moe.gate.wg.weight.grad, plain.deepspeed_moe.gate.wg.weight.grad),
                  "expert_grad": relative(spread_experts, over_group[local]),
                  "expert_grad_reduced": relative(over_data, over_world[local]),
                  "expert_ranks": list(groups.expert_ranks), "expert_data_ranks": list(groups.expert_data_ranks)}
        print("RESULT " + json.dumps(record), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
