"""Train the tiny Llama with Accelerate and a DeepSpeed plugin, as Accelerate's DeepSpeed examples do.

The optimizer and scheduler come from the DeepSpeed config (``DummyOptim``/``DummyScheduler`` carry the
learning rate and warm-up into its ``"auto"`` values); the loop is ``accelerator.backward`` and
``optimizer.step``; ``--save_at N`` writes ``accelerator.save_state`` after step N and
``--resume_from DIR`` starts from one with ``accelerator.load_state``. Rank 0 writes the per-step
losses (mean over ranks), the eval loss and where the model went to ``--report`` (JSON).

    torchrun --nproc_per_node 2 train_accelerate.py --use_cpu --ds_config configs/accelerate_zero2.json \
        --output_dir out --report out/report.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from accelerate import Accelerator, PartialState  # noqa: E402
from accelerate.utils import DataLoaderConfiguration, DeepSpeedPlugin, DummyOptim, DummyScheduler, set_seed  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_data import StrideTokens, llama_config  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ds_config", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--report", default="")
    parser.add_argument("--use_cpu", action="store_true", help="train on CPU ranks (gloo)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--batch_size", type=int, default=4, help="per rank")
    parser.add_argument("--learning_rate", type=float, default=5e-3)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--warmup_steps", type=int, default=2)
    parser.add_argument("--max_steps", type=int, default=10)
    parser.add_argument("--train_samples", type=int, default=48)
    parser.add_argument("--eval_samples", type=int, default=32)
    parser.add_argument("--save_at", type=int, default=0, help="save_state after this step")
    parser.add_argument("--stop_after_save", action="store_true", help="end the run right after --save_at")
    parser.add_argument("--resume_from", default="", help="a folder written by save_state")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.use_cpu:
        # Starts the gloo process group first; Accelerator(cpu=True) would leave DeepSpeed out altogether.
        PartialState(cpu=True)
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=args.ds_config),
                              dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=args.seed))
    set_seed(args.seed)
    model = AutoModelForCausalLM.from_config(llama_config())   # partitioned as it is built, at ZeRO-3

    train_loader = DataLoader(StrideTokens(args.train_samples, seed=1234), batch_size=args.batch_size, shuffle=True)
    eval_loader = DataLoader(StrideTokens(args.eval_samples, seed=1235), batch_size=8)
    optimizer = DummyOptim(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    scheduler = DummyScheduler(optimizer, total_num_steps=args.max_steps * accelerator.num_processes,
                               warmup_num_steps=args.warmup_steps)
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, scheduler)

    step = 0
    if args.resume_from:
        accelerator.load_state(args.resume_from)
        step = json.loads((Path(args.resume_from) / "progress.json").read_text())["step"]
    losses = train(args, accelerator, model, optimizer, scheduler, train_loader, step)

    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    unwrapped.save_pretrained(args.output_dir, is_main_process=accelerator.is_main_process,
                              save_function=accelerator.save, state_dict=accelerator.get_state_dict(model))
    report = {"steps": losses, "eval_loss": evaluate(accelerator, model, eval_loader),
              "world_size": accelerator.num_processes,
              "zero_stage": accelerator.state.deepspeed_plugin.zero_stage}
    if accelerator.is_main_process and args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(report, indent=1))


def train(args, accelerator, model, optimizer, scheduler, train_loader, step: int) -> list[dict]:
    losses = []
    per_epoch = len(train_loader)
    model.train()
    while step < args.max_steps:
        epoch, done_in_epoch = divmod(step, per_epoch)
        train_loader.set_epoch(epoch)
        batches = accelerator.skip_first_batches(train_loader, done_in_epoch) if done_in_epoch else train_loader
        for batch in batches:
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            losses.append({"step": step, "loss": accelerator.reduce(loss.detach(), reduction="mean").item(),
                           "learning_rate": scheduler.get_last_lr()[0]})
            if step == args.save_at:
                save(accelerator, Path(args.output_dir) / f"state_step{step}", step)
                if args.stop_after_save:
                    return losses
            if step == args.max_steps:
                break
    return losses


def save(accelerator, folder: Path, step: int) -> None:
    accelerator.save_state(str(folder))
    if accelerator.is_main_process:
        (folder / "progress.json").write_text(json.dumps({"step": step}))
    accelerator.wait_for_everyone()


def evaluate(accelerator, model, eval_loader) -> float:
    model.eval()
    losses = []
    with torch.no_grad():
        for batch in eval_loader:
            loss = model(**batch).loss
            losses.append(accelerator.gather_for_metrics(loss.repeat(len(batch["input_ids"]))))
    return torch.cat(losses).mean().item()


if __name__ == "__main__":
    main()
