"""A DeepSpeed run stopped at a step and continued, on DeepSpeed or on dslaunch's engine (issue 41 item 4).

Written as a DeepSpeed script: ``--engine deepspeed`` (the default) runs it with ``import deepspeed``,
``--engine dslaunch`` with ``from launcher import zero as deepspeed`` (the port rule of
docs/migrating/deepspeed.md; it also runs where a real DeepSpeed is installed, which ``--as-deepspeed``
refuses). ``switch_worker.py STAGE PRECISION [--engine E] [--steps N] [--save_at K --save DIR]
[--load DIR] [--out FILE] [--allow_fp16_on_cpu 1]``; PRECISION is fp32, bf16 or fp16.

A small MLP, AdamW with gradient clipping and a WarmupLR schedule still warming up at the
checkpoint, 8 samples an optimizer step at any world size (4 per rank and micro-batch, the
accumulation makes up the rest), so a run at 1 rank and one at 2 do the same arithmetic. Step s
reads samples 8s..8s+7 wherever the run started, so a continued run sees what the straight one saw.
With ``--save`` the checkpoint is written after step K with a client state; with ``--load`` the
run starts from a checkpoint and goes on to step N. Rank 0 prints ``RESULT {...}``: each step's
loss (averaged over every rank and micro-batch), the lr and loss scale after it, what load_checkpoint
returned, and the final weights' absolute sums.
"""
import importlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

GLOBAL_BATCH, MICRO = 8, 4
CLIENT_STATE = {"epoch": 3, "note": "switch", "seen": [1, 2, 3]}


def data(steps: int):
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(steps * GLOBAL_BATCH, 8, generator=generator)
    y = torch.tanh(x @ torch.randn(8, 4, generator=generator)) + 0.05 * torch.randn(len(x), 4, generator=generator)
    return x, y


def config(stage: int, precision: str, world: int) -> dict:
    settings = {"train_batch_size": GLOBAL_BATCH, "train_micro_batch_size_per_gpu": MICRO,
                "gradient_accumulation_steps": GLOBAL_BATCH // (MICRO * world), "gradient_clipping": 1.0,
                "zero_optimization": {"stage": stage}, "steps_per_print": 1000,
                "optimizer": {"type": "AdamW", "params": {"lr": 2e-2, "weight_decay": 0.01}},
                "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 2e-3, "warmup_max_lr": 2e-2,
                                                             "warmup_num_steps": 6, "warmup_type": "linear"}}}
    if precision == "bf16":
        settings["bf16"] = {"enabled": True}
    if precision == "fp16":
        settings["fp16"] = {"enabled": True, "initial_scale_power": 8, "loss_scale_window": 3}
    return settings


def train_step(engine, x, y, step: int, dtype) -> float:
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.zeros(())
    accumulation = GLOBAL_BATCH // (MICRO * world)
    for micro in range(accumulation):
        at = step * GLOBAL_BATCH + (micro * world + rank) * MICRO
        out = engine(x[at:at + MICRO].to(dtype))
        loss = torch.nn.functional.mse_loss(out.float(), y[at:at + MICRO])
        engine.backward(loss)
        engine.step()
        total += loss.detach().float()
    dist.all_reduce(total)
    return total.item() / (accumulation * world)


def loss_scale(engine) -> float:
    if hasattr(engine, "get_loss_scale"):     # dslaunch's engine: the current scale (1.0 without one)
        return float(engine.get_loss_scale())
    scale = getattr(engine.optimizer, "loss_scale", None)   # DeepSpeed's fp16 and ZeRO optimizers' property
    return float(scale) if isinstance(scale, (int, float)) else 1.0


def weights(deepspeed, engine, stage: int) -> list[float]:
    params = list(engine.module.parameters())
    if stage < 3:
        return [round(float(p.detach().float().abs().sum()), 6) for p in params]
    with deepspeed.zero.GatheredParameters(params):
        return [round(float(p.detach().float().abs().sum()), 6) for p in params]


def main(stage: int, precision: str, options: dict) -> None:
    deepspeed = importlib.import_module("launcher.zero" if options["engine"] == "dslaunch" else "deepspeed")
    if options["allow_fp16_on_cpu"] and options["engine"] == "deepspeed":
        # DeepSpeed's CPU accelerator allows fp16 only where mkldnn has fp16 kernels; torch's CPU
        # kernels run it anyway (the recording of fp16 checkpoints, scripts/record_deepspeed_switch.py)
        deepspeed.accelerator.get_accelerator().is_fp16_supported = lambda: True
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    world = int(__import__("os").environ.get("WORLD_SIZE", "1"))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config(stage, precision, world))
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    report = {"engine": options["engine"], "world_size": dist.get_world_size(), "steps": {}}
    if options["load"]:
        path, client = engine.load_checkpoint(options["load"])
        report["loaded"] = {"global_steps": engine.global_steps, "global_samples": engine.global_samples,
                            "client_state": {k: client.get(k) for k in CLIENT_STATE}, "path_found": path is not None,
                            "lr": engine.get_lr()[0], "loss_scale": loss_scale(engine)}
    x, y = data(options["steps"])
    for step in range(engine.global_steps, options["steps"]):
        loss = train_step(engine, x, y, step, dtype)
        report["steps"][str(step)] = {"loss": loss, "lr": engine.get_lr()[0], "loss_scale": loss_scale(engine)}
        if options["save"] and step + 1 == options["save_at"]:
            engine.save_checkpoint(options["save"], client_state=dict(CLIENT_STATE))
    report["global_steps"] = engine.global_steps
    report["weights"] = weights(deepspeed, engine, stage)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(report), flush=True)
        if options["out"]:
            Path(options["out"]).write_text(json.dumps(report, indent=1) + "\n")


def parse(argv: list[str]) -> tuple[int, str, dict]:
    options = {"engine": "deepspeed", "steps": 8, "save_at": 4, "save": None, "load": None, "out": None,
               "allow_fp16_on_cpu": None}
    rest = [a for a in argv if not a.startswith("--local_rank")]
    stage, precision, flags = int(rest[0]), rest[1], rest[2:]
    for key, value in zip(flags[::2], flags[1::2]):
        name = key.lstrip("-")
        options[name] = int(value) if name in ("steps", "save_at") else value
    return stage, precision, options


if __name__ == "__main__":
    main(*parse(sys.argv[1:]))
