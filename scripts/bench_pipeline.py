"""Measure the pipeline bubble per schedule on CPU: ``dslaunch --num_gpus S scripts/bench_pipeline.py``.

Each rank is one stage (data-parallel size 1) of a stack of square Linear+Tanh layers. For each
schedule and micro-batch count it times ``train_batch`` (after warm-up) and the time every stage
spends blocked in receives during the schedule; the bubble fraction is that idle time over the
schedule's wall time, averaged over stages, printed next to the ideal: (S - 1) / (M + S - 1) for
GPipe and 1F1B, (S - 1) / (V * M + S - 1) for interleaved 1F1B with V virtual stages per rank
(each rank then holds V chunks of 1/V the layers, so a warm-up slot is V times shorter).
Every schedule trains the same model (same layers, same micro-batches), so step times compare.
A figure, not a test: on a shared CPU the spread between repeats is part of the answer.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist
from torch import nn

from launcher import zero
from launcher.zero.pipe import LayerSpec, PipelineModule


def measure(schedule: str, micro_batches: int, args) -> dict:
    layers = [spec for _ in range(args.layers) for spec in (LayerSpec(nn.Linear, args.width, args.width),
                                                            LayerSpec(nn.Tanh))]
    stages = int(os.environ.get("WORLD_SIZE", "1"))
    virtual = args.virtual_stages if schedule == "interleaved" else 1
    module = PipelineModule(layers, num_stages=stages, loss_fn=nn.functional.mse_loss, partition_method="uniform",
                            num_virtual_stages=virtual)
    config = {"train_micro_batch_size_per_gpu": args.micro_batch, "gradient_accumulation_steps": micro_batches,
              "optimizer": {"type": "SGD", "params": {"lr": 1e-4}}, "pipeline": {"schedule": schedule}}
    engine, _, _, _ = zero.initialize(model=module, config=config)
    x = torch.randn(args.micro_batch, args.width)
    data = iter(lambda: (x, x), None)
    walls, bubbles = [], []
    for repeat in range(args.warmup + args.repeats):
        dist.barrier()
        engine.train_batch(data)
        timing = torch.tensor([engine.schedule_timing["wall_s"], engine.schedule_timing["recv_wait_s"]],
                              dtype=torch.float64)
        gathered = [torch.zeros_like(timing) for _ in range(stages)]
        dist.all_gather(gathered, timing)
        if repeat >= args.warmup:
            walls.append(max(float(t[0]) for t in gathered))
            bubbles.append(statistics.mean(float(t[1] / t[0]) for t in gathered))
    return {"schedule": schedule, "stages": stages, "virtual_stages": virtual, "micro_batches": micro_batches,
            "step_s": statistics.median(walls), "step_s_min": min(walls), "step_s_max": max(walls),
            "bubble_fraction": statistics.median(bubbles),
            "ideal_bubble_fraction": (stages - 1) / (virtual * micro_batches + stages - 1)}


def table(results: list[dict]) -> str:
    """The records side by side: one line per schedule and micro-batch count."""
    lines = ["schedule     M  V  step s (min-max)          bubble measured  ideal"]
    for r in results:
        lines.append(f"{r['schedule']:<11} {r['micro_batches']:>2} {r['virtual_stages']:>2}  "
                     f"{r['step_s']:.4f} ({r['step_s_min']:.4f}-{r['step_s_max']:.4f})  "
                     f"{r['bubble_fraction']:>15.3f}  {r['ideal_bubble_fraction']:.3f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8, help="Linear+Tanh pairs in the whole model")
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--micro-batches", default="4,8")
    parser.add_argument("--schedules", default="gpipe,1f1b,interleaved")
    parser.add_argument("--virtual-stages", type=int, default=2, help="chunks per rank for 'interleaved'")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--local_rank", type=int, help="appended by dslaunch (DeepSpeed's habit); unused")
    args = parser.parse_args()
    zero.init_distributed()
    results = []
    for schedule in args.schedules.split(","):
        for micro_batches in (int(m) for m in args.micro_batches.split(",")):
            results.append(measure(schedule, micro_batches, args))
            if dist.get_rank() == 0:
                print("RESULT " + json.dumps(results[-1]), flush=True)
    if dist.get_rank() == 0:
        print(table(results), flush=True)


if __name__ == "__main__":
    main()
