"""DeepSpeed's CIFAR-10 tutorial with ``--moe``, written against DeepSpeed's API (random images).

Run by tests/dist/test_moe_tutorial.py unchanged under ``dslaunch --as-deepspeed`` and with its
imports ported to ``from launcher import zero as deepspeed``. The network, data and recorded
options come from tests/helpers/moe_cases.py (shared with scripts/record_deepspeed_moe.py).
Prints ``RESULT {json}`` with the per-step losses and learning rates; ``--save_dir`` saves a
checkpoint after the steps, ``--load_dir`` resumes from one first.
"""
import argparse
import json
import re

import deepspeed
import torch
from deepspeed.moe.layer import MoE
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
from deepspeed.utils import groups

from tests.helpers import moe_cases


def add_argument():
    parser = argparse.ArgumentParser(description="CIFAR MoE")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--run", default="top1_rsample", help="a TUTORIAL_RUNS name (the --moe options)")
    parser.add_argument("--ep-world-size", type=int, default=1, help="expert-parallel world size")
    parser.add_argument("--moe-param-group", action="store_true", help="separate param groups for experts")
    parser.add_argument("--steps", type=int, default=moe_cases.TUTORIAL_STEPS, help="train up to this step")
    parser.add_argument("--save_dir", default=None)
    parser.add_argument("--load_dir", default=None)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main():
    args = add_argument()
    deepspeed.init_distributed()
    run = next(r for r in moe_cases.TUTORIAL_RUNS if r["name"] == args.run)
    options = _options(run)    # seeds the weights as the recording did
    net = moe_cases.CifarMoENet(MoE, ep_size=args.ep_world_size, **options)
    parameters = filter(lambda p: p.requires_grad, net.parameters())
    if args.moe_param_group:
        parameters = split_params_into_different_moe_groups_for_optimizer(
            {"params": [p for p in net.parameters()], "name": "parameters"})
    engine, optimizer, _, _ = deepspeed.initialize(args=args, model=net, model_parameters=parameters)
    start, loaded = 0, None
    if args.load_dir:
        _, client = engine.load_checkpoint(args.load_dir)
        start, loaded = client["step"], digests(engine.module, args.ep_world_size, run["num_experts"])
    criterion = torch.nn.CrossEntropyLoss()
    rank, world = engine.global_rank, engine.world_size
    if args.load_dir is None:
        torch.manual_seed(moe_cases.TUTORIAL_SEED + 1)   # the gates' draws, as the recording
    data = moe_cases.synthetic_cifar(max(args.steps, moe_cases.TUTORIAL_STEPS), moe_cases.TUTORIAL_BATCH)
    losses, lrs = [], []
    micro = engine.train_micro_batch_size_per_gpu()
    for images, labels in data[start:args.steps]:
        dp_rank = groups._get_data_parallel_rank()
        images, labels = images[dp_rank * micro:(dp_rank + 1) * micro], labels[dp_rank * micro:(dp_rank + 1) * micro]
        loss = criterion(engine(images), labels)
        engine.backward(loss)
        lrs.append(engine.get_lr()[0])
        engine.step()
        losses.append(loss.item())
    if args.save_dir:
        engine.save_checkpoint(args.save_dir, client_state={"step": args.steps})
    weights = digests(engine.module, args.ep_world_size, run["num_experts"])
    print("RESULT " + json.dumps({"rank": rank, "losses": losses, "lrs": lrs, "weights": weights, "loaded": loaded,
                                  "groups": [(g["name"], g.get("moe", False)) for g in optimizer.param_groups],
                                  "ep_ranks": groups._get_expert_parallel_group_ranks(f"ep_size_{args.ep_world_size}"),
                                  "world": world}), flush=True)


def digests(module, ep_size: int, num_experts: list) -> dict:
    """Each parameter's sum and norm, experts named by their global id (ep rank * local experts + i)."""
    ep_rank = groups._get_expert_parallel_rank(f"ep_size_{ep_size}")
    found = {}
    for name, param in module.named_parameters():
        match = re.search(r"moe_layer_list\.(\d+)\.deepspeed_moe\.experts\.deepspeed_experts\.(\d+)\.", name)
        if match:
            local = num_experts[int(match.group(1))] // ep_size
            name = f"{name[:match.start(2)]}{ep_rank * local + int(match.group(2))}{name[match.end(2):]}"
        found[name] = [float(param.detach().double().sum()), float(param.detach().double().norm())]
    return found


def _options(run):
    options = {k: run[k] for k in ("k", "noisy_gate_policy", "min_capacity", "mlp_type") if k in run}
    torch.manual_seed(moe_cases.TUTORIAL_SEED)
    return {"num_experts": run["num_experts"], **options}


if __name__ == "__main__":
    main()
