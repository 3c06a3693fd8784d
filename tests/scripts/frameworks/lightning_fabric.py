"""Train the tiny model with Lightning Fabric and ``strategy="deepspeed_stage_N"``, as Fabric's DeepSpeed guide does.

``fabric.init_module()`` builds the model (partitioned as it is built, at stage 3), ``fabric.setup``
hands model and optimizer to ``deepspeed.initialize``, and the loop is ``fabric.backward(loss)``,
``optimizer.step()``, ``optimizer.zero_grad()`` on what ``setup`` returned (DeepSpeed's engine.step()
is never called: Fabric steps the returned optimizer). ``--save_at N`` writes ``fabric.save`` after
step N (DeepSpeed's ``save_checkpoint`` with a client state) and ``--resume_from DIR`` starts from
one with ``fabric.load``. Rank 0 writes every step's loss (mean over ranks) to ``--report`` (JSON).
Nothing here knows which engine runs it; the CPU guard is lifted by cpu_guard.py.

    torchrun --nproc_per_node 2 lightning_fabric.py --stage 2 --report out/report.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_guard  # noqa: E402
from tiny_task import StrideTokens, TinyLM, mean_loss  # noqa: E402

import lightning as L  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", type=int, required=True, choices=(1, 2, 3), help="deepspeed_stage_<N>")
    parser.add_argument("--report", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=4, help="per rank")
    parser.add_argument("--learning_rate", type=float, default=5e-3)
    parser.add_argument("--save_at", type=int, default=0, help="fabric.save after this step")
    parser.add_argument("--checkpoint", default="", help="where --save_at saves")
    parser.add_argument("--stop_after_save", action="store_true")
    parser.add_argument("--resume_from", default="", help="a folder written by fabric.save")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    cpu_guard.lift_all()
    fabric = L.Fabric(accelerator="cpu", devices=args.devices, strategy=f"deepspeed_stage_{args.stage}",
                      precision="32-true")
    fabric.launch()
    fabric.seed_everything(42)
    with fabric.init_module():
        model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.01)
    model, optimizer = fabric.setup(model, optimizer)
    data = StrideTokens(args.steps * args.batch_size * args.devices, seed=1234)
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=args.batch_size, shuffle=True))

    state = {"model": model, "optimizer": optimizer, "step": 0}
    if args.resume_from:
        fabric.load(args.resume_from, state)
    losses = train(args, fabric, model, optimizer, loader, state)
    report = {"steps": losses, "world_size": fabric.world_size, "zero_stage": args.stage,
              "engine_class": type(model._forward_module).__name__,
              "optimizer_class": type(optimizer.optimizer).__name__,
              "eval_loss": evaluate(fabric, model, StrideTokens(32, seed=1235))}
    if fabric.global_rank == 0:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(report, indent=1))


def train(args, fabric, model, optimizer, loader, state: dict) -> list[dict]:
    losses = []
    model.train()
    for index, batch in enumerate(loader):
        if index < state["step"]:
            continue                       # resumed: these batches were trained on before the save
        loss = model(batch)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        state["step"] += 1
        losses.append({"step": state["step"], "loss": fabric.all_reduce(loss.detach(), reduce_op="mean").item()})
        if state["step"] == args.save_at:
            fabric.save(args.checkpoint, state)
            if args.stop_after_save:
                break
    return losses


def evaluate(fabric, model, data: StrideTokens) -> float:
    """The eval loss of the trained model (gathered at stage 3 by the engine's forward), mean over ranks."""
    model.eval()
    loss = torch.tensor(mean_loss(model, data))
    return fabric.all_reduce(loss, reduce_op="mean").item()


if __name__ == "__main__":
    main()
