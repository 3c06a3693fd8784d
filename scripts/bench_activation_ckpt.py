"""Peak memory and step time of the benchmark GPT with and without activation checkpointing.

    python scripts/bench_activation_ckpt.py                          # GPU: the 406M GPT, batches 8,16,32
    python scripts/bench_activation_ckpt.py --batch-sizes 32        # one batch size
    python scripts/bench_activation_ckpt.py --tiny --steps 2        # CPU smoke run

One training step = forward, backward, AdamW step. For every batch size the same model and
optimizer are measured twice: plain, then with every block checkpointed
(launcher.zero.checkpointing.checkpoint_blocks) and the head + loss run in --loss-chunks
checkpointed pieces (checkpointing.chunked_loss; 1 leaves the head alone). Reported per run:
- peak_bytes: CUDA max_memory_allocated over the timed steps on the GPU; on the CPU the peak
  of one step as torch's MemTracker (torch.distributed._tools) counts every live tensor
  (parameters, gradients, optimizer state, activations, temporaries);
- saved_activation_bytes: bytes autograd holds for backward at the end of forward, counted
  through a saved-tensors hook (parameters excluded, shared storage counted once): works on
  CPU too and is the part checkpointing shrinks;
- step_ms: median step time (CUDA events on GPU, perf_counter on CPU), the two variants
  alternating step by step so that a drift in the machine's speed hits both alike.
Prints one JSON document; `ratios` compares checkpointed to plain (targets:
peak <= 0.5, step time cost < 40%).
"""

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import torch  # noqa: E402
from tests.helpers.gpt import GPT, TINY, GPTConfig  # noqa: E402

from launcher.zero import checkpointing  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="8,16,32", help="comma-separated micro-batch sizes")
    p.add_argument("--steps", type=int, default=5, help="timed steps of each variant (alternating)")
    p.add_argument("--n-layer", type=int, default=GPTConfig.n_layer)
    p.add_argument("--n-embd", type=int, default=GPTConfig.n_embd)
    p.add_argument("--n-head", type=int, default=GPTConfig.n_head)
    p.add_argument("--seq-len", type=int, default=GPTConfig.seq_len)
    p.add_argument("--vocab-size", type=int, default=GPTConfig.vocab_size)
    p.add_argument("--tiny", action="store_true", help="tests/helpers/gpt.py's TINY, for CPU smoke runs")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default=None, help="autocast dtype (default bf16 on CUDA)")
    p.add_argument("--cpu-checkpointing", action="store_true", help="also offload checkpoints to CPU")
    p.add_argument("--loss-chunks", type=int, default=8,
                   help="checkpointed pieces of the head + loss in the checkpointed run (1: not chunked)")
    p.add_argument("--device", default=None)
    return p.parse_args(argv)


class SavedBytes:
    """Counts the distinct non-parameter storage autograd saves for backward."""

    def __init__(self, params):
        self.param_ptrs = {p.untyped_storage().data_ptr() for p in params}
        self.storages = {}

    def pack(self, tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.param_ptrs:
            self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    def total(self):
        return sum(self.storages.values())


class Timer:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.end.record()
            torch.cuda.synchronize()
            self.ms = self.start.elapsed_time(self.end)
        else:
            self.ms = (time.perf_counter() - self.t0) * 1e3


def train_step(model, opt, batch, autocast_dtype, device, counter=None):
    idx, targets = batch
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        if counter is None:
            loss = model(idx, targets)
        else:
            with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
                loss = model(idx, targets)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def measure(model, opt, batch, device, autocast_dtype):
    """Memory of one variant: a warm-up step, a counted step, then the peak of one more step."""
    train_step(model, opt, batch, autocast_dtype, device)
    counter = SavedBytes(model.parameters())
    train_step(model, opt, batch, autocast_dtype, device, counter)
    result = {"saved_activation_bytes": counter.total(), "peak_bytes": None, "steady_bytes": None}
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        train_step(model, opt, batch, autocast_dtype, device)
        torch.cuda.synchronize()
        result.update(peak_bytes=torch.cuda.max_memory_allocated(device), steady_bytes=before)
    else:
        result["peak_bytes"] = cpu_peak_bytes(model, opt, batch, autocast_dtype, device)
    return result


def cpu_peak_bytes(model, opt, batch, autocast_dtype, device) -> int:
    """Peak bytes of live tensors over one step, by torch's MemTracker (slow: one step only)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        train_step(model, opt, batch, autocast_dtype, device)
    return int(tracker.get_tracker_snapshot("peak")[device]["Total"])


def set_variant(model, args, checkpointed) -> None:
    if checkpointed:
        checkpointing.configure(None, checkpoint_in_cpu=args.cpu_checkpointing)
        checkpointing.checkpoint_blocks(model)
        model.loss_chunks = args.loss_chunks
    else:
        checkpointing.uncheckpoint_blocks(model)
        model.loss_chunks = 1


def step_times(model, opt, batch, args, device, autocast_dtype) -> dict:
    """Median step time of each variant, the two alternating step by step (fair under drift)."""
    times = {False: [], True: []}
    for _ in range(args.steps):
        for checkpointed in (False, True):
            set_variant(model, args, checkpointed)
            with Timer(device) as timer:
                train_step(model, opt, batch, autocast_dtype, device)
            times[checkpointed].append(timer.ms)
    return {variant: statistics.median(found) for variant, found in times.items()}


def run_batch(model, opt, config, batch_size, args, device, autocast_dtype) -> dict:
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(config.vocab_size, (batch_size, config.seq_len + 1), generator=gen).to(device)
    batch = (idx[:, :-1], idx[:, 1:])
    found = {}
    try:
        for checkpointed in (False, True):
            set_variant(model, args, checkpointed)
            found[checkpointed] = measure(model, opt, batch, device, autocast_dtype)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        for checkpointed, ms in step_times(model, opt, batch, args, device, autocast_dtype).items():
            found[checkpointed]["step_ms"] = ms
    except torch.OutOfMemoryError as exc:
        opt.zero_grad(set_to_none=True)
        error = {"error": "out of memory", "detail": str(exc).splitlines()[0]}
        found = {False: found.get(False, error), True: error}
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    plain, ckpt = found[False], found[True]
    return {"batch_size": batch_size, "plain": plain, "checkpointed": ckpt, "ratios": ratios(plain, ckpt)}


def ratios(plain, ckpt):
    if "error" in plain or "error" in ckpt or "step_ms" not in ckpt:
        return None
    out = {"step_time": ckpt["step_ms"] / plain["step_ms"],
           "saved_activation": ckpt["saved_activation_bytes"] / max(1, plain["saved_activation_bytes"])}
    if plain["peak_bytes"]:
        out["peak"] = ckpt["peak_bytes"] / plain["peak_bytes"]
    return out


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype_name = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    autocast_dtype = torch.bfloat16 if dtype_name == "bf16" else None
    config = TINY if args.tiny else GPTConfig(args.n_layer, args.n_embd, args.n_head, args.seq_len, args.vocab_size)
    torch.manual_seed(0)
    model = GPT(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if device.type == "cuda" else {}))
    runs = []
    for batch_size in (int(b) for b in args.batch_sizes.split(",")):
        runs.append(run_batch(model, opt, config, batch_size, args, device, autocast_dtype))
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "dtype": dtype_name, "model": dataclasses.asdict(config),
        "params": sum(p.numel() for p in model.parameters()), "seq_len": config.seq_len,
        "cpu_checkpointing": args.cpu_checkpointing, "loss_chunks": args.loss_chunks, "runs": runs,
        "targets": {"peak_ratio_max": 0.5, "step_time_ratio_max": 1.4},
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
