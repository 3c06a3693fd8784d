"""Train a tiny Llama with the Hugging Face Trainer, as the run_clm tutorial does, with ``--deepspeed``.

Nothing here knows which engine runs it: the same file runs under a real DeepSpeed and under
``dslaunch --as-deepspeed``. It writes what a user watches to ``--report`` (JSON, rank 0): the
loss of every optimizer step, the eval loss, where the model was saved, and at ZeRO-3 whether
``from_pretrained`` under the DeepSpeed config built the model partitioned.

    torchrun --nproc_per_node 2 train_clm.py --deepspeed configs/zero2.json --use_cpu \
        --output_dir out --max_steps 10 --report out/report.json
"""
from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import (AutoModelForCausalLM, HfArgumentParser, LlamaForCausalLM, Trainer,  # noqa: E402
                          TrainerCallback, TrainingArguments, set_seed)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_data import StrideTokens, llama_config  # noqa: E402

logger = logging.getLogger(__name__)


@dataclass
class DataArguments:
    train_samples: int = field(default=96, metadata={"help": "training samples made from --data_seed_base"})
    eval_samples: int = field(default=32, metadata={"help": "evaluation samples (another seed)"})
    data_seed_base: int = field(default=1234, metadata={"help": "seed of the token data"})


@dataclass
class ReportArguments:
    report: str = field(default="", metadata={"help": "JSON file for the losses (written by rank 0)"})
    stop_after_step: int = field(default=0, metadata={"help": "end training after this step (an interruption)"})


class StopAfter(TrainerCallback):
    """Ends training after a given step, once that step's checkpoint is written: a run cut short."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if self.step and state.global_step >= self.step:
            control.should_training_stop = True
        return control


def step_losses(log_history: list[dict]) -> list[dict]:
    return [{"step": entry["step"], "loss": entry["loss"], "grad_norm": entry.get("grad_norm"),
             "learning_rate": entry.get("learning_rate")}
            for entry in log_history if "loss" in entry and "step" in entry]


def partitioned_load(output_dir: str) -> dict:
    """Load the saved model while the DeepSpeed config is live: at ZeRO-3 it is built partitioned."""
    import deepspeed
    from safetensors.torch import load_file

    model = LlamaForCausalLM.from_pretrained(output_dir)
    params = list(model.parameters())
    report = {"every_param_partitioned": all(hasattr(p, "ds_id") for p in params),
              "local_numel": sum(p.numel() for p in params),
              "full_numel": sum(int(getattr(p, "ds_numel", p.numel())) for p in params)}
    saved = load_file(os.path.join(output_dir, "model.safetensors"))
    names = dict(model.named_parameters())
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        report["gathered_equals_saved"] = all(torch.equal(names[n].detach().cpu(), saved[n]) for n in saved if n in names)
    return report


def main() -> None:
    parser = HfArgumentParser((TrainingArguments, DataArguments, ReportArguments))
    training_args, data_args, report_args = parser.parse_args_into_dataclasses()
    # as run_clm does; asking for the device also starts the process group, before the model is built
    logger.warning(f"rank {training_args.process_index}: device {training_args.device}, "
                   f"world size {training_args.world_size}, parallel mode {training_args.parallel_mode.value}")
    if training_args.deepspeed and training_args.use_cpu:
        # On CPU the Trainer starts the process group through torch (--use_cpu), not through DeepSpeed, and
        # DeepSpeed's zero.Init (ZeRO-3's from_config) asks DeepSpeed's own comm layer for the world size:
        # left down, it sees a world of 1 and refuses the batch sizes. On GPUs accelerate does this itself.
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo")

    set_seed(training_args.seed)
    model = AutoModelForCausalLM.from_config(llama_config())
    train_data = StrideTokens(data_args.train_samples, seed=data_args.data_seed_base)
    eval_data = StrideTokens(data_args.eval_samples, seed=data_args.data_seed_base + 1)

    callbacks = [StopAfter(report_args.stop_after_step)] if report_args.stop_after_step else []
    trainer = Trainer(model=model, args=training_args, train_dataset=train_data, eval_dataset=eval_data,
                      callbacks=callbacks)
    resume = training_args.resume_from_checkpoint
    if resume is not None and resume.lower() in ("true", "1"):
        resume = True
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model()
    metrics = trainer.evaluate()

    report = {"steps": step_losses(trainer.state.log_history), "eval_loss": metrics["eval_loss"],
              "global_step": trainer.state.global_step, "world_size": training_args.world_size,
              "zero_stage": trainer.accelerator.state.deepspeed_plugin.zero_stage
              if trainer.accelerator.state.deepspeed_plugin else None}
    if report["zero_stage"] == 3:
        report["from_pretrained_under_zero3"] = partitioned_load(training_args.output_dir)
    if training_args.process_index == 0 and report_args.report:
        Path(report_args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(report_args.report).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
