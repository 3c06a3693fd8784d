"""A small pipeline under each schedule: ``dslaunch --num_gpus 4 examples/train_pipeline.py --schedule gpipe``.

Six Linear+Tanh pairs and a tied input/output projection, split over 2 stages (x data = world / 2).
``--schedule`` picks ``gpipe`` (all forwards, then all backwards), ``1f1b`` (the default: one forward,
one backward once the pipe is full) or ``interleaved`` (1F1B over 2 virtual stages per rank: each
rank holds two non-adjacent chunks of the layers, so the warm-up bubble is half as long).
``--zero-stage 1`` partitions the optimizer state over the data axis. It learns a fixed random
linear map: the last loss printed is a fraction of the first.
"""
from __future__ import annotations

import argparse

import torch
from torch import nn

from launcher import zero
from launcher.zero.pipe import LayerSpec, PipelineModule, TiedLayerSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved"], default="1f1b")
    parser.add_argument("--zero-stage", type=int, choices=[0, 1], default=0)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--width", type=int, default=32)
    args, _ = parser.parse_known_args()     # DeepSpeed's --local_rank is appended by the launcher
    zero.init_distributed()
    width = args.width
    layers = [TiedLayerSpec("io", nn.Linear, width, width, bias=False)]
    layers += [spec for _ in range(6) for spec in (LayerSpec(nn.Linear, width, width), LayerSpec(nn.Tanh))]
    layers += [TiedLayerSpec("io", nn.Linear, width, width, bias=False)]
    model = PipelineModule(layers, num_stages=2, loss_fn=nn.functional.mse_loss, partition_method="uniform",
                           num_virtual_stages=2 if args.schedule == "interleaved" else 1, seed_layers=True)
    engine, _, _, _ = zero.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "pipeline": {"schedule": args.schedule},
        "zero_optimization": {"stage": args.zero_stage}})
    generator = torch.Generator().manual_seed(engine.grid.get_data_parallel_rank())
    target = torch.randn(width, width, generator=torch.Generator().manual_seed(0)) / width ** 0.5 / 4

    def batches():
        while True:
            x = torch.randn(8, width, generator=generator)
            yield x, x @ target

    data = batches()
    first = float(engine.train_batch(data))
    for _ in range(args.steps - 1):
        loss = float(engine.train_batch(data))
    if engine.global_rank == 0:
        print(f"schedule {args.schedule}, stages {engine.num_stages}, data {engine.grid.get_data_parallel_world_size()}, "
              f"zero stage {args.zero_stage}: first loss {first:.4f}, last loss {loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
