#!/usr/bin/env python3
"""ZeRO-3 step time and memory: our stage 3 next to PyTorch's FSDP2 on the same GPT model.

Run one process per GPU, e.g.  python -m torch.distributed.run --nproc-per-node 2 \
    scripts/bench_stage3.py --layers 12 --hidden 1024
Rank 0 prints one line per variant: ms/step, tokens/s, peak GPU memory, first and last loss.
Both variants use bf16 parameters with fp32 master weights and AdamW(lr=1e-4); with --cpu they
run on gloo in fp32 (peak memory is then not measured).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.up = torch.nn.Linear(hidden, 4 * hidden)
        self.down = torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, layers: int, hidden: int, vocab: int, seq: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.pos = torch.nn.Embedding(seq, hidden)
        self.blocks = torch.nn.ModuleList([Block(hidden, max(1, hidden // 64)) for _ in range(layers)])
        self.ln = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.embed(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x)).float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def batches(args, rank, device):
    gen = torch.Generator().manual_seed(1234 + rank)
    for _ in range(args.steps + args.warmup):
        idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=gen)
        yield idx[:, :-1].to(device), idx[:, 1:].to(device)


def run_ours(args, rank, world_size, device, offload: bool):
    from launcher import zero
    zero_cfg = {"stage": 3, "overlap_comm": True, "stage3_prefetch_bucket_size": args.prefetch}
    precision = {} if args.cpu else {"bf16": {"enabled": True}}
    if offload:
        zero_cfg["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    config = {"train_micro_batch_size_per_gpu": args.batch, **precision, "gradient_clipping": 1.0,
              "zero_optimization": zero_cfg, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    optimizer = None
    if offload:
        from launcher.zero.optim.cpu_adam import CPUAdam
        config.pop("optimizer")
        optimizer = lambda params: CPUAdam(params, lr=1e-4, weight_decay=0.01)  # noqa: E731
    torch.manual_seed(0)
    with zero.Init(device=device):
        model = GPT(args.layers, args.hidden, args.vocab, args.seq)
    engine, _, _, _ = zero.initialize(model=model, optimizer=optimizer, config=config)

    def step(idx, targets):
        loss = engine(idx, targets)
        engine.backward(loss)
        engine.step()
        return loss
    return step, sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())


def run_fsdp2(args, rank, world_size, device):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    torch.manual_seed(0)
    model = GPT(args.layers, args.hidden, args.vocab, args.seq).to(device)
    numel = sum(p.numel() for p in model.parameters())
    policy = MixedPrecisionPolicy() if args.cpu else MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                          reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(idx, targets):
        loss = model(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        return loss
    return step, numel


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(name, build, args, rank, world_size, device):
    import gc
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    step, numel = build()
    losses, start = [], None
    for index, (idx, targets) in enumerate(batches(args, rank, device)):
        if index == args.warmup:
            sync(device)
            start = time.perf_counter()
        losses.append(float(step(idx, targets)))
    sync(device)
    seconds = (time.perf_counter() - start) / args.steps
    return {"variant": name, "params": numel, "ms_per_step": seconds * 1e3,
            "tokens_per_s": args.batch * args.seq * world_size / seconds,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan"), "first_loss": losses[0], "last_loss": losses[-1]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--prefetch", type=int, default=50_000_000)
    p.add_argument("--variants", default="ours,fsdp2,ours_offload")
    p.add_argument("--cpu", action="store_true", help="gloo on the CPU, fp32")
    args = p.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.cpu:
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        device = torch.device("cuda", local_rank)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    builders = {"ours": lambda: run_ours(args, rank, world_size, device, False),
                "ours_offload": lambda: run_ours(args, rank, world_size, device, True),
                "fsdp2": lambda: run_fsdp2(args, rank, world_size, device)}
    results = []
    for name in args.variants.split(","):
        results.append(measure(name, builders[name], args, rank, world_size, device))
        dist.barrier()
    if rank == 0:
        name = "CPU (gloo)" if args.cpu else torch.cuda.get_device_name()
        print(f"torch {torch.__version__}, {world_size} x {name}, "
              f"{results[0]['params'] / 1e6:.0f}M params, batch {args.batch}x{args.seq} per GPU")
        for r in results:
            print(f"{r['variant']:<14} {r['ms_per_step']:8.1f} ms/step {r['tokens_per_s']:10.0f} tok/s "
                  f"peak {r['peak_gib']:6.2f} GiB  loss {r['first_loss']:.3f} -> {r['last_loss']:.3f}")
        print("JSON " + json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
