"""bf16 master weights, gradients and Adam moments with optimizer offload, per-step losses (issue 43 item 3).

Written as a DeepSpeed script (``import deepspeed``): it runs unchanged under a real DeepSpeed and under
``dslaunch --as-deepspeed``. ``bf16_states_worker.py STAGE KEYS [OFFLOAD] [--out DIR]``: KEYS ``masters``
sets ``bf16.bf16_master_weights_and_grads`` (bf16 masters and gradients, fp32 Adam moments), ``states``
sets ``bf16_optimizer_states`` too (bf16 moments). ZeRO STAGE 1-3 with ``offload_optimizer`` on the CPU
(OFFLOAD ``cpu``, the default) or without offload (``none``: DeepSpeed allows that with ``states`` only), a
small MLP in bf16, 12 optimizer steps of 2 micro-batches of 4 samples per rank (AdamW, gradient
clipping 1.0); each rank reads its own slice of one fixed data set. Rank 0 prints ``RESULT {"losses":
[...], "weights": [...], "masters": [...], "moments": [...]}``: per step the loss averaged over the ranks
and micro-batches, each parameter's absolute sum at the end (gathered at stage 3), and the dtypes of the
tensors the inner optimizer steps and of its Adam moments (``engine.optimizer.optimizer``, the CPU Adam
or the device optimizer under the ZeRO optimizer, in both engines).
"""
import json
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

STEPS, MICRO, GAS = 12, 4, 2
KEYS = {"masters": {"bf16_master_weights_and_grads": True},
        "states": {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}}


def data(world: int):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS * GAS * MICRO * world, 8, generator=generator)
    y = torch.tanh(x @ torch.randn(8, 4, generator=generator)) + 0.05 * torch.randn(len(x), 4, generator=generator)
    return x, y


def config(stage: int, keys: str, offload: str = "cpu") -> dict:
    zero = {"stage": stage, **({"offload_optimizer": {"device": "cpu"}} if offload == "cpu" else {})}
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
            "gradient_clipping": 1.0, "bf16": {"enabled": True, **KEYS[keys]},
            "zero_optimization": zero,
            "optimizer": {"type": "AdamW", "params": {"lr": 2e-2, "weight_decay": 0.01}}, "steps_per_print": 1000}


def weights(model: torch.nn.Module, stage: int) -> list:
    params = list(model.parameters())
    if stage < 3:
        return [round(float(p.detach().float().abs().sum()), 6) for p in params]
    with deepspeed.zero.GatheredParameters(params):
        return [round(float(p.detach().float().abs().sum()), 6) for p in params]


def state_dtypes(engine) -> dict:
    """The dtypes the optimizer under the ZeRO optimizer steps: its parameters (the masters) and moments."""
    inner = engine.optimizer.optimizer
    params = [p for group in inner.param_groups for p in group["params"]]
    if not params:   # DeepSpeed's stage 3 hands its flat masters to the optimizer only inside step()
        params = list(getattr(engine.optimizer, "fp32_partitioned_groups_flat", []))
    masters = {str(p.dtype) for p in params}
    moments = {str(t.dtype) for state in inner.state.values() for key, t in state.items() if key.startswith("exp_avg")}
    return {"masters": sorted(masters), "moments": sorted(moments)}


def main(stage: int, keys: str, offload: str, out=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config(stage, keys, offload))
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = data(world)
    losses = []
    for step in range(STEPS):
        total = torch.zeros(())
        for micro in range(GAS):
            at = ((step * GAS + micro) * world + rank) * MICRO
            out_ = engine(x[at:at + MICRO].to(torch.bfloat16))
            loss = torch.nn.functional.mse_loss(out_.float(), y[at:at + MICRO])
            engine.backward(loss)
            engine.step()
            total += loss.detach()
        dist.all_reduce(total)
        losses.append(total.item() / (GAS * world))
    final = weights(model, stage)
    if rank == 0:
        record = {"losses": losses, "weights": final, **state_dtypes(engine)}
        print("RESULT " + json.dumps(record), flush=True)
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "rank0.json").write_text(json.dumps(record))


if __name__ == "__main__":
    argv = sys.argv[1:]
    out = argv[argv.index("--out") + 1] if "--out" in argv else None
    positional = [a for a in argv if a != out and a != "--out"]
    main(int(positional[0]), positional[1], positional[2] if len(positional) > 2 else "cpu", out)
