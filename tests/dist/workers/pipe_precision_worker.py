"""Rank-side pipeline precision checks (pipe 2 x data 2): bf16 tracks fp32, an fp16 overflow on one stage.

argv: ``bf16`` or ``fp16`` [ZeRO stage, 0 or 1 [model, ``plain`` or ``tied``]]. bf16: 4 steps next to the fp32 single-process reference of the parity
worker; prints the max weight error. fp16: at step 2 a NaN is put into one gradient of stage 0 on
data rank 0 only; every rank must skip that step (and only it) and halve the loss scale.
"""
import json
import os
import sys

import torch
from torch import nn

from launcher import zero
from launcher.zero.pipe import PipelineModule
from tests.dist.workers.pipe_worker import (BASE_SEED, CLIP, LR, MBS, STEPS, _tied, data, micro_batches, reference,
                                            specs)


def _fp32_weights(engine) -> dict:
    """How many fp32 weight elements this rank keeps (whole masters, the ZeRO-1 slice) next to its stage's."""
    masters = sum(m.numel() for m in engine.masters) if engine.masters is not None else 0
    sliced = engine.shard.param.numel() if engine.shard is not None else 0
    return {"fp32_weight_numel": masters + sliced,
            "stage_numel": sum(p.numel() for p in engine.module.parameters() if p.requires_grad)}


def main():
    precision, zero_stage = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
    model = sys.argv[3] if len(sys.argv) > 3 else "plain"
    zero.init_distributed()
    module = PipelineModule(specs(model), num_stages=2, loss_fn=lambda out, y: nn.functional.mse_loss(out.float(), y),
                            partition_method="parameters", seed_layers=True, base_seed=BASE_SEED)
    config = {"train_micro_batch_size_per_gpu": MBS, "gradient_accumulation_steps": 2, "gradient_clipping": CLIP,
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.99], "eps": 1e-8,
                                                        "weight_decay": 0.01}},
              precision: {"enabled": True, **({"initial_scale_power": 8} if precision == "fp16" else {})},
              "zero_optimization": {"stage": zero_stage}}
    engine, _, _, _ = zero.initialize(model=module, config=config)
    grid = engine.grid
    poisoned = {"armed": False}
    if precision == "fp16" and grid.get_stage_id() == 0 and grid.get_data_parallel_rank() == 0:
        first = next(p for p in module.parameters())
        first.register_hook(lambda grad: grad.masked_fill(torch.ones_like(grad, dtype=torch.bool), float("nan"))
                            if poisoned["armed"] else grad)
    x, y = data(2, 2)
    batches = micro_batches(x, y, 2, 2, grid.get_data_parallel_rank())
    skipped, scales, losses = [], [], []
    for step in range(STEPS):
        poisoned["armed"] = step == 1
        losses.append(float(engine.train_batch(batches)))
        skipped.append(engine.skipped_steps)
        scales.append(engine.loss_scaler.scale if engine.loss_scaler is not None else None)
    layers, ref_losses = reference(model, 2, 2)
    error = 0.0
    for key, value in engine.module.named_parameters():
        index, _, name = key.partition(".")
        owner = layers[int(index)] if index.isdigit() else _tied(layers, module, name.split(".")[0])
        expected = owner.get_parameter(name if index.isdigit() else name.split(".", 1)[1]).detach()
        error = max(error, (value.detach().float() - expected).abs().max().item())
    print("RESULT " + json.dumps({"rank": int(os.environ["RANK"]), "dtype": str(next(module.parameters()).dtype),
                                  "max_abs_error": error, "skipped": skipped, "losses": losses,
                                  "reference_losses": [loss for loss, _ in ref_losses], "scales": scales,
                                  "sharded": engine.shard is not None, "stage": grid.get_stage_id(),
                                  "data_rank": grid.get_data_parallel_rank(), **_fp32_weights(engine),
                                  "weights": [float(v) for p in engine.module.parameters()
                                              for v in p.detach().float().flatten()],
                                  "tied": {key: [float(v) for v in module.tied_modules[key].weight.detach().float()
                                                 .flatten()[:8]] for key in module.tied_modules}}), flush=True)


if __name__ == "__main__":
    main()
