"""Train a small character-level GPT with the bundled ZeRO engine.

    dslaunch --num_gpus 2 examples/train_gpt.py --config examples/configs/zero2.json

Runs on CPU (gloo) or GPU (NCCL). The launcher appends ``--local_rank=N`` and sets RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT; ``zero.initialize`` reads them. The training loop is
DeepSpeed's: ``loss = engine(x, y)``, ``engine.backward(loss)``, ``engine.step()``.

In 3D (pipeline stages x tensor-parallel blocks x ZeRO-0 data parallelism; ``gpt3d.py``)::

    dslaunch --num_gpus 8 examples/train_gpt.py --pipeline 2 --tensor 2 --config examples/configs/pipe3d.json

where the step is ``loss = engine.train_batch(batches)`` (gradient_accumulation_steps micro-batches).
"""
from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from launcher import zero

HERE = Path(__file__).resolve().parent


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.dropout(self.proj(attended.transpose(1, 2).reshape(batch, length, width)))
        return x + self.dropout(self.mlp(self.norm2(x)))


class GPT(nn.Module):
    """Token + position embeddings, a stack of blocks, and an output head tied to the embedding."""

    def __init__(self, vocab: int, block_size: int, width: int = 96, layers: int = 3, heads: int = 4,
                 dropout: float = 0.0):
        super().__init__()
        self.block_size = block_size
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(block_size, width)
        self.blocks = nn.Sequential(*[Block(width, heads, dropout) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight  # weight tying (one parameter, two names)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.blocks(self.tokens(idx) + self.positions(positions))
        logits = self.head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def param_groups(model: nn.Module, weight_decay: float = 0.1) -> list[dict]:
    """Decay matrices, not biases, norms or embeddings' positions (nanoGPT's rule)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def load_corpus(path: Path) -> tuple[torch.Tensor, list[str]]:
    text = path.read_text(encoding="utf-8")
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return torch.tensor([index[c] for c in text], dtype=torch.long), chars


def get_batch(data: torch.Tensor, batch: int, block: int, generator: torch.Generator, device):
    starts = torch.randint(len(data) - block - 1, (batch,), generator=generator)
    x = torch.stack([data[s:s + block] for s in starts])
    y = torch.stack([data[s + 1:s + block + 1] for s in starts])
    return x.to(device), y.to(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None,
                        help="engine config (JSON/YAML); default: dslaunch --config, else configs/zero2.json")
    parser.add_argument("--local_rank", type=int, default=0, help="set by the launcher (zero reads LOCAL_RANK)")
    parser.add_argument("--steps", type=int, default=150, help="optimizer steps")
    parser.add_argument("--block_size", type=int, default=64)
    parser.add_argument("--data", default=str(HERE / "data" / "corpus.txt"))
    parser.add_argument("--save_dir", default=None, help="save a checkpoint here at the end")
    parser.add_argument("--resume", action="store_true", help="first load the latest checkpoint in --save_dir")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--pipeline", type=int, default=None, help="pipeline stages (3D training, gpt3d.py)")
    parser.add_argument("--tensor", type=int, default=None, help="tensor-parallel ranks per stage (3D training)")
    parser.add_argument("--sequence-parallel", action="store_true",
                        help="with --tensor: split the activations between the blocks' linears along the sequence")
    args = parser.parse_args()
    if args.resume and not args.save_dir:
        parser.error("--resume needs --save_dir (the folder to load the latest checkpoint from)")
    if args.pipeline or args.tensor:
        return train_3d(args)

    torch.manual_seed(args.seed)  # same initial weights on every rank
    data, chars = load_corpus(Path(args.data))
    split = int(0.9 * len(data))
    train, val = data[:split], data[split:]
    model = GPT(vocab=len(chars), block_size=args.block_size)
    # no --config: the engine takes dslaunch's --config (DSLAUNCH_CONFIG), else our stage-2 default
    config = args.config or (None if os.environ.get("DSLAUNCH_CONFIG") else str(HERE / "configs" / "zero2.json"))
    engine, _, _, _ = zero.initialize(model=model, model_parameters=param_groups(model), config=config)
    engine.total_steps = args.steps   # the progress line shows step=N/total and an ETA
    rank, micro = engine.global_rank, engine.train_micro_batch_size_per_gpu()
    if args.resume and os.path.isfile(os.path.join(args.save_dir, "latest")):
        path, _ = engine.load_checkpoint(args.save_dir)
        if rank == 0:
            print(f"[train_gpt] resumed from {path} at step {engine.global_steps}")
    # each rank its own batches; a resumed run draws new ones, not the first steps' again
    generator = torch.Generator().manual_seed(args.seed + 1000 * rank + engine.global_steps)

    first_loss, started = None, time.perf_counter()
    while engine.global_steps < args.steps:
        x, y = get_batch(train, micro, args.block_size, generator, engine.device)
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        if first_loss is None:
            first_loss = loss.item()
    elapsed = time.perf_counter() - started

    engine.eval()
    with torch.no_grad():
        eval_gen = torch.Generator().manual_seed(0)
        losses = [engine(*get_batch(val, 16, args.block_size, eval_gen, engine.device)).item() for _ in range(8)]
    engine.train()
    if args.save_dir:
        engine.save_checkpoint(args.save_dir)
    if rank == 0:
        mib = {k: round(v / 2**20, 3) for k, v in engine.memory_breakdown().items()}
        params = sum(p.numel() for p in model.parameters())
        print(f"[train_gpt] world_size={engine.world_size} stage={engine.zero_optimization_stage()} "
              f"params={params} steps={engine.global_steps} skipped={engine.skipped_steps}")
        print(f"[train_gpt] first loss {first_loss:.4f} (ln vocab = {math.log(len(chars)):.4f}) -> "
              f"val loss {sum(losses) / len(losses):.4f} in {elapsed:.1f}s")
        print(f"[train_gpt] memory_breakdown (MiB): {mib}")


def train_3d(args) -> None:
    """The same GPT over a pipe x data x tensor grid; every data rank draws its own batches."""
    import os

    from gpt3d import build_pipeline_gpt

    from launcher.zero.parallel.grid import ParallelGrid
    from launcher.zero.parallel.topology import topology_for

    zero.init_distributed()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    grid = ParallelGrid(topology_for(world_size, pipe=args.pipeline or 1, model=args.tensor or 1))
    data, chars = load_corpus(Path(args.data))
    split = int(0.9 * len(data))
    train, val = data[:split], data[split:]
    module = build_pipeline_gpt(grid, vocab=len(chars), block_size=args.block_size,
                                sequence_parallel=args.sequence_parallel)
    engine, _, _, _ = zero.initialize(model=module, config=args.config)
    micro, data_rank = engine.train_micro_batch_size_per_gpu(), grid.get_data_parallel_rank()
    generator = torch.Generator().manual_seed(args.seed + 1000 * data_rank)   # tensor ranks share batches
    batches = iter(lambda: get_batch(train, micro, args.block_size, generator, engine.device), None)
    started = time.perf_counter()
    first_loss = float(engine.train_batch(batches))
    while engine.global_steps < args.steps:
        loss = engine.train_batch(batches)
    elapsed = time.perf_counter() - started
    eval_gen = torch.Generator().manual_seed(0)
    val_loss = float(engine.eval_batch(iter(lambda: get_batch(val, 16, args.block_size, eval_gen, engine.device), None),
                                       num_micro_batches=8))
    if args.save_dir:
        engine.save_checkpoint(args.save_dir)
    if engine.global_rank == 0:
        params = sum(p.numel() for p in module.parameters())
        print(f"[train_gpt] 3D pipe={grid.get_pipe_parallel_world_size()} data={grid.get_data_parallel_world_size()} "
              f"tensor={grid.get_model_parallel_world_size()} sequence_parallel={args.sequence_parallel} "
              f"stage-0 params on rank 0={params} "
              f"steps={engine.global_steps} last loss {float(loss):.4f}")
        print(f"[train_gpt] first loss {first_loss:.4f} (ln vocab = {math.log(len(chars)):.4f}) -> "
              f"val loss {val_loss:.4f} in {elapsed:.1f}s")


if __name__ == "__main__":
    main()
