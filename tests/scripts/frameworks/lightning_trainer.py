"""Train the tiny model with a Lightning ``Trainer(strategy="deepspeed_stage_N")``, as Lightning's DeepSpeed guide does.

A ``LightningModule`` builds its model in ``configure_model`` (under ``zero.Init`` at stage 3), returns
AdamW and a warm-up ``LambdaLR`` (stepped every optimizer step) from ``configure_optimizers``, and
accumulates 2 micro-batches a step (DeepSpeed's ``gradient_accumulation_steps``). Epoch boundaries are
where a run stops and resumes: ``--epochs`` ends it, ``trainer.save_checkpoint(--checkpoint)``
writes DeepSpeed's checkpoint folder at the end and ``--resume_from`` continues one through
``fit(ckpt_path=...)``. ``--consolidate FILE`` then turns the checkpoint into one fp32 file with
``lightning.pytorch.utilities.deepspeed.convert_zero_checkpoint_to_fp32_state_dict`` (DeepSpeed's
``zero_to_fp32`` underneath). Rank 0 writes each micro-batch's loss (mean over ranks) and each
step's learning rate to ``--report``. The CPU guard is lifted by cpu_guard.py.

    torchrun --nproc_per_node 2 lightning_trainer.py --stage 3 --report out/report.json
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

MICRO_BATCH, ACCUMULATE, SAMPLES, WARMUP = 4, 2, 32, 3   # 4 micro-batches, 2 optimizer steps an epoch on 2 ranks


class TinyModule(L.LightningModule):
    def __init__(self, learning_rate: float):
        super().__init__()
        self.learning_rate = learning_rate
        self.net = None

    def configure_model(self) -> None:
        if self.net is None:
            self.net = TinyLM()

    def training_step(self, batch: torch.Tensor, batch_index: int) -> torch.Tensor:
        return self.net(batch)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.learning_rate, weight_decay=0.01)
        warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}

    def train_dataloader(self) -> DataLoader:
        return DataLoader(StrideTokens(SAMPLES, seed=1234), batch_size=MICRO_BATCH, shuffle=True)


class Recorder(L.Callback):
    """Every micro-batch's loss (mean over ranks, numbered across epochs) and the learning rate it trained at."""

    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_index) -> None:
        loss = trainer.strategy.reduce(outputs["loss"].detach(), reduce_op="mean")
        step = trainer.current_epoch * trainer.num_training_batches + batch_index + 1
        self.losses.append({"step": step, "loss": loss.item(), "global_step": trainer.global_step,
                            "learning_rate": trainer.optimizers[0].param_groups[0]["lr"]})


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", type=int, required=True, choices=(1, 2, 3), help="deepspeed_stage_<N>")
    parser.add_argument("--report", required=True)
    parser.add_argument("--epochs", type=int, default=4, help="train until this many epochs are done")
    parser.add_argument("--learning_rate", type=float, default=5e-3)
    parser.add_argument("--checkpoint", default="", help="trainer.save_checkpoint here at the end")
    parser.add_argument("--resume_from", default="", help="fit(ckpt_path=...) from this checkpoint")
    parser.add_argument("--consolidate", default="", help="convert --checkpoint to one fp32 file here")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    cpu_guard.lift_all()
    L.seed_everything(42)
    recorder = Recorder()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=f"deepspeed_stage_{args.stage}", precision="32-true",
                        max_epochs=args.epochs, accumulate_grad_batches=ACCUMULATE, callbacks=[recorder],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    module = TinyModule(args.learning_rate)
    trainer.fit(module, ckpt_path=args.resume_from or None)
    report = {"steps": recorder.losses, "world_size": trainer.world_size, "zero_stage": args.stage,
              "global_step": trainer.global_step, "engine_class": type(trainer.strategy.model).__name__}
    if args.checkpoint:
        trainer.save_checkpoint(args.checkpoint)
    if args.consolidate:
        report["consolidated"] = consolidate(trainer, args.checkpoint, args.consolidate)
    if trainer.is_global_zero:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(report, indent=1))


def consolidate(trainer, checkpoint: str, output: str) -> dict:
    """Lightning's conversion on rank 0, then what the consolidated file holds and how it scores."""
    from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

    trainer.strategy.barrier()
    if not trainer.is_global_zero:
        return {}
    saved = convert_zero_checkpoint_to_fp32_state_dict(checkpoint, output)
    model = TinyLM()
    model.load_state_dict({key.removeprefix("net."): value for key, value in saved["state_dict"].items()})
    return {"keys": sorted(saved), "state_dict": sorted(saved["state_dict"]), "global_step": saved.get("global_step"),
            "epoch": saved.get("epoch"), "eval_loss": mean_loss(model, StrideTokens(32, seed=1235))}


if __name__ == "__main__":
    main()
