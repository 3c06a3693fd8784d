"""Rank-side parity check: ZeRO stages vs. single-process torch.optim.AdamW on the global batch.

Prints one ``RESULT {json}`` line per case with the max abs weight difference.
"""
import json
import sys

import torch

from launcher import zero

from tests.helpers.tiny import MBS, STEPS, data, groups, make_model, reference  # noqa: F401


def run_case(stage, gas, clip, bucket, rank, world_size, steps=STEPS):
    model = make_model()
    config = {"train_micro_batch_size_per_gpu": MBS, "gradient_accumulation_steps": gas,
              "gradient_clipping": clip, "zero_optimization": {"stage": stage, "reduce_bucket_size": bucket,
                                                               "overlap_comm": bucket % 2 == 0,
                                                               "allgather_bucket_size": 7 if bucket == 9 else 5e8},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "betas": [0.9, 0.99], "eps": 1e-8}}}
    engine, _, _, _ = zero.initialize(model=model, model_parameters=groups(model), config=config)
    x, y = data(world_size, gas, steps)
    for step in range(steps):
        for micro in range(gas):
            start = ((step * gas + micro) * world_size + rank) * MBS
            xs, ys = x[start:start + MBS].to(engine.device), y[start:start + MBS].to(engine.device)
            loss = torch.nn.functional.mse_loss(engine(xs), ys)
            engine.backward(loss)
            engine.step()
    ref = reference(world_size, gas, clip, steps)
    error = max((a.detach().cpu() - b).abs().max().item() for a, b in zip(model.parameters(), ref.parameters()))
    ref_change = max((a - b).abs().max().item() for a, b in zip(make_model().parameters(), ref.parameters()))
    return {"stage": stage, "world_size": world_size, "gas": gas, "clip": clip, "bucket": bucket,
            "max_abs_error": error, "reference_change": ref_change, "global_steps": engine.global_steps,
            "memory": engine.memory_breakdown()}


def main():
    rank = int(__import__("os").environ["RANK"])
    world_size = int(__import__("os").environ["WORLD_SIZE"])
    stages = [int(s) for s in sys.argv[1].split(",")] if len(sys.argv) > 1 else [0, 1, 2]
    for stage in stages:
        for gas, clip, bucket in ((1, 0.0, 500_000_000), (3, 0.05, 16), (2, 1.0, 9)):
            print("RESULT " + json.dumps(run_case(stage, gas, clip, bucket, rank, world_size)), flush=True)


if __name__ == "__main__":
    main()
