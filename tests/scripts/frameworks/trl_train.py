"""Fine-tune the tiny Llama with TRL's ``SFTTrainer`` or ``DPOTrainer`` and ``--deepspeed CONFIG``, as TRL's docs do.

The trainer gets a model *name* (a folder this script writes first, one per rank, so that nothing is
downloaded): TRL loads the model, and for DPO the reference model, from it, builds them under
``zero.Init`` at ZeRO-3, and at DPO wraps the reference model in an optimizer-less DeepSpeed engine
(``trl.models.prepare_deepspeed``). fp32 (``--bf16 false``; TRL's default is bf16). Rank 0 writes
the loss of every optimizer step to ``--report`` (JSON). Nothing here knows which engine runs it;
TRL has no CPU guard of its own (the Trainer's ``use_cpu`` keeps DeepSpeed on with gloo); the script
starts DeepSpeed's process group itself, as the Trainer's arguments do on a GPU (see ``main``).

    torchrun --nproc_per_node 2 trl_train.py --trainer dpo --deepspeed ../hf/configs/zero3.json \
        --output_dir out --report out/report.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import deepspeed  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_text import preference_rows, save_tiny_model, sft_rows  # noqa: E402


class StepLosses(TrainerCallback):
    """The logged loss (and DPO's reward margin) of every optimizer step, as a user reads them."""

    def __init__(self):
        self.steps = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.steps.append({"step": state.global_step, "loss": logs["loss"], "grad_norm": logs.get("grad_norm"),
                               "learning_rate": logs.get("learning_rate"),
                               "margin": logs.get("rewards/margins")})


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainer", choices=("sft", "dpo"), required=True)
    parser.add_argument("--deepspeed", required=True, help="a DeepSpeed config (the HF docs' 'auto' ones)")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("--max_steps", type=int, default=6)
    parser.add_argument("--learning_rate", type=float, default=5e-3)
    return parser.parse_args()


def trainer_for(args, model_name: str, callback: StepLosses):
    common = dict(output_dir=args.output_dir, deepspeed=args.deepspeed, use_cpu=True, bf16=False,
                  max_steps=args.max_steps, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                  learning_rate=args.learning_rate, warmup_steps=2, logging_steps=1, save_strategy="no",
                  report_to="none", seed=42, data_seed=42, disable_tqdm=True, max_length=32)
    if args.trainer == "sft":
        from trl import SFTConfig, SFTTrainer

        return SFTTrainer(model=model_name, args=SFTConfig(**common), callbacks=[callback],
                          train_dataset=Dataset.from_dict(sft_rows(96, seed=1234)))
    from trl import DPOConfig, DPOTrainer

    return DPOTrainer(model=model_name, args=DPOConfig(**common, beta=0.1), callbacks=[callback],
                      train_dataset=Dataset.from_dict(preference_rows(96, seed=1234)))


def main() -> None:
    args = parse_args()
    rank = int(os.environ.get("RANK", "0"))
    model_name = str(save_tiny_model(Path(args.output_dir) / f"tiny-llama-rank{rank}"))   # before the group:
    # with one, save_pretrained writes on the main process only
    # On a GPU the Trainer's arguments start DeepSpeed's process group (accelerate's DeepSpeed state calls
    # deepspeed.init_distributed) before TRL loads the model; with use_cpu they start plain gloo, and
    # DeepSpeed's zero.Init (ZeRO-3) then sizes its config at world size 1. So the script starts it, on gloo.
    deepspeed.init_distributed(dist_backend="gloo")
    callback = StepLosses()
    trainer = trainer_for(args, model_name, callback)
    trainer.train()
    report = {"steps": callback.steps, "world_size": trainer.args.world_size, "global_step": trainer.state.global_step,
              "engine_class": type(trainer.model_wrapped).__name__}
    if getattr(trainer, "ref_model", None) is not None:
        report["ref_engine_class"] = type(trainer.ref_model).__name__
    if rank == 0:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
