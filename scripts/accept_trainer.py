"""The acceptance run's stock Hugging Face Trainer script (scripts/gpu_accept.py runs it three times).

What a user runs: ``HfArgumentParser`` -> ``TrainingArguments``, a model from ``from_pretrained``,
``Trainer(...).train()``; with ``--deepspeed ds_config.json`` it trains under DeepSpeed, or under
our engine when started by ``dslaunch --as-deepspeed``; without it, the Trainer's own bf16 (fp32
weights under autocast). The model is loaded from the weights gpu_accept.py saved from the seed,
so every run starts from the same weights (at ZeRO-3 ``from_pretrained`` builds it partitioned).
A callback times each step (device synchronised) and keeps the peak GPU memory; the losses
(``logging_steps 1``) go to ``--report``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402
from transformers import (AutoModelForCausalLM, HfArgumentParser, Trainer, TrainerCallback,  # noqa: E402
                          TrainingArguments, set_seed)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accept_models import stride_tokens  # noqa: E402


@dataclass
class RunArguments:
    model_name_or_path: str = field(default="", metadata={"help": "the saved starting weights"})
    seq_len: int = field(default=1024, metadata={"help": "tokens per sample"})
    report: str = field(default="", metadata={"help": "JSON file for the losses and step times"})


class Tokens(Dataset):
    """Learnable token rows (accept_models.stride_tokens): causal-LM samples, labels = input_ids."""

    def __init__(self, count: int, seq_len: int, vocab: int):
        self.rows = stride_tokens(count, seq_len, vocab)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.rows[index], "labels": self.rows[index].clone()}


class StepClock(TrainerCallback):
    """Each optimizer step's wall time, the device synchronised at both ends; the peak GPU memory."""

    def __init__(self):
        self.step_ms: list[float] = []
        self._began = 0.0
        self.cuda = torch.cuda.is_available()

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def on_train_begin(self, args, state, control, **kwargs):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def on_step_begin(self, args, state, control, **kwargs):
        self._sync()
        self._began = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self._sync()
        self.step_ms.append((time.perf_counter() - self._began) * 1e3)


def main() -> None:
    parser = HfArgumentParser((TrainingArguments, RunArguments))
    training_args, run_args = parser.parse_args_into_dataclasses()
    if training_args.deepspeed and training_args.use_cpu:
        # on the CPU the Trainer starts the process group through torch, not DeepSpeed (train_clm.py says why)
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo")
    set_seed(training_args.seed)
    model = AutoModelForCausalLM.from_pretrained(run_args.model_name_or_path, torch_dtype=torch.float32)
    samples = training_args.max_steps * training_args.per_device_train_batch_size
    data = Tokens(samples, run_args.seq_len, model.config.vocab_size)
    clock = StepClock()
    trainer = Trainer(model=model, args=training_args, train_dataset=data, callbacks=[clock])
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry and "step" in entry]
    report = {"losses": losses, "step_ms": clock.step_ms, "global_step": trainer.state.global_step,
              "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if clock.cuda else None}
    if training_args.process_index == 0 and run_args.report:
        Path(run_args.report).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
