"""The example GPT as pipeline stages with tensor-parallel blocks (used by ``train_gpt.py --pipeline/--tensor``).

Megatron's split of a block: q, k, v and the MLP's first linear are column-parallel (each tensor
rank holds ``heads / tensor`` heads and ``1 / tensor`` of the MLP width), the attention output and the
MLP's second linear row-parallel (their partial sums all-reduced); layer norms are replicated.
The vocabulary is split too: the embedding, the head and the cross-entropy never hold all logits.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from launcher.zero.parallel.tensor import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                                           apply_tensor_parallel, vocab_parallel_cross_entropy)
from launcher.zero.pipe import LayerSpec, PipelineModule

BLOCK_PLAN = {"q": "colwise", "k": "colwise", "v": "colwise", "proj": "rowwise", "fc": "colwise", "out": "rowwise"}


class Embed(nn.Module):
    def __init__(self, vocab: int, block_size: int, width: int, group):
        super().__init__()
        self.tokens = VocabParallelEmbedding(torch.randn(vocab, width) * 0.02, group)
        self.positions = nn.Embedding(block_size, width)
        nn.init.normal_(self.positions.weight, std=0.02)

    def forward(self, idx):
        return self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))


class TensorParallelBlock(nn.Module):
    """Pre-norm causal self-attention and MLP, split over the tensor group by BLOCK_PLAN."""

    def __init__(self, width: int, heads: int, group):
        super().__init__()
        tensor = torch.distributed.get_world_size(group)
        self.local_heads, self.head_dim = heads // tensor, width // heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)
        self.proj, self.fc, self.out = nn.Linear(width, width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        for linear in (self.q, self.k, self.v, self.proj, self.fc, self.out):
            nn.init.normal_(linear.weight, std=0.02)
            nn.init.zeros_(linear.bias)
        apply_tensor_parallel(self, BLOCK_PLAN, group)

    def forward(self, x):
        batch, length, _ = x.shape
        h = self.norm1(x)
        q, k, v = (f(h).view(batch, length, self.local_heads, self.head_dim).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, -1))
        return x + self.out(F.gelu(self.fc(self.norm2(x))))


class Head(nn.Module):
    def __init__(self, width: int, vocab: int, group):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.logits = ColumnParallelLinear(torch.randn(vocab, width) * 0.02, None, group)

    def forward(self, x):
        return self.logits(self.norm(x))


def build_pipeline_gpt(grid, vocab: int, block_size: int, width: int = 96, layers: int = 3, heads: int = 4):
    """The GPT as a PipelineModule over ``grid``; the vocabulary is padded to a multiple of the tensor size."""
    group, tensor = grid.get_model_parallel_group(), grid.get_model_parallel_world_size()
    if heads % tensor:
        raise SystemExit(f"--tensor {tensor} must divide the {heads} attention heads")
    padded = -(-vocab // tensor) * tensor

    def loss_fn(logits, targets):
        return vocab_parallel_cross_entropy(logits, targets, group).mean()

    specs = [LayerSpec(Embed, padded, block_size, width, group)]
    specs += [LayerSpec(TensorParallelBlock, width, heads, group) for _ in range(layers)]
    specs += [LayerSpec(Head, width, padded, group)]
    return PipelineModule(specs, topology=grid, loss_fn=loss_fn, partition_method="type:TensorParallelBlock",
                          seed_layers=True)
