"""The example GPT as pipeline stages with tensor-parallel blocks (used by ``train_gpt.py --pipeline/--tensor``).

Megatron's split of a block: q, k, v and the MLP's first linear are column-parallel (each tensor
rank holds ``heads / tensor`` heads and ``1 / tensor`` of the MLP width), the attention output and the
MLP's second linear row-parallel (their partial sums all-reduced); layer norms are replicated.
The vocabulary is split too: the embedding, the head and the cross-entropy never hold all logits.

With ``sequence_parallel=True`` (``train_gpt.py --sequence-parallel``) the activations between the
blocks' linears are split along the sequence: the embedding's output is scattered, every layer norm
and residual runs on 1/tensor of the positions (the norms' gradients summed over the tensor group),
the column-parallel linears all-gather the sequence and the row-parallel ones reduce-scatter it; the
head's column-parallel linear gathers it back for the loss. The block size must divide by the tensor size.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from launcher.zero.parallel.sequence import SequenceParallelLayerNorm, scatter_sequence
from launcher.zero.parallel.tensor import (ColumnParallelLinear, VocabParallelEmbedding, apply_tensor_parallel,
                                           vocab_parallel_cross_entropy)
from launcher.zero.pipe import LayerSpec, PipelineModule

BLOCK_PLAN = {"q": "colwise", "k": "colwise", "v": "colwise", "proj": "rowwise", "fc": "colwise", "out": "rowwise",
              "norm*": "norm"}


class Embed(nn.Module):
    def __init__(self, vocab: int, block_size: int, width: int, group, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.tokens = VocabParallelEmbedding(torch.randn(vocab, width) * 0.02, group)
        self.positions = nn.Embedding(block_size, width)
        nn.init.normal_(self.positions.weight, std=0.02)

    def forward(self, idx):
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        return scatter_sequence(x, self.group) if self.sequence_parallel else x


class TensorParallelBlock(nn.Module):
    """Pre-norm causal self-attention and MLP, split over the tensor group by BLOCK_PLAN."""

    def __init__(self, width: int, heads: int, group, sequence_parallel: bool = False):
        super().__init__()
        tensor = torch.distributed.get_world_size(group)
        self.local_heads, self.head_dim = heads // tensor, width // heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)
        self.proj, self.fc, self.out = nn.Linear(width, width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        for linear in (self.q, self.k, self.v, self.proj, self.fc, self.out):
            nn.init.normal_(linear.weight, std=0.02)
            nn.init.zeros_(linear.bias)
        apply_tensor_parallel(self, BLOCK_PLAN, group, sequence_parallel=sequence_parallel)

    def forward(self, x):
        batch = x.shape[0]
        h = self.norm1(x)      # under sequence parallelism: this rank's positions; q, k, v see all of them
        q, k, v = (f(h).view(batch, -1, self.local_heads, self.head_dim).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, q.shape[2], -1))
        return x + self.out(F.gelu(self.fc(self.norm2(x))))


class Head(nn.Module):
    def __init__(self, width: int, vocab: int, group, sequence_parallel: bool = False):
        super().__init__()
        self.norm = SequenceParallelLayerNorm.from_norm(nn.LayerNorm(width), group) if sequence_parallel \
            else nn.LayerNorm(width)
        self.logits = ColumnParallelLinear(torch.randn(vocab, width) * 0.02, None, group,
                                           sequence_parallel=sequence_parallel)

    def forward(self, x):
        return self.logits(self.norm(x))


def build_pipeline_gpt(grid, vocab: int, block_size: int, width: int = 96, layers: int = 3, heads: int = 4,
                       sequence_parallel: bool = False):
    """The GPT as a PipelineModule over ``grid``; the vocabulary is padded to a multiple of the tensor size."""
    group, tensor = grid.get_model_parallel_group(), grid.get_model_parallel_world_size()
    if heads % tensor:
        raise SystemExit(f"--tensor {tensor} must divide the {heads} attention heads")
    if sequence_parallel and block_size % tensor:
        raise SystemExit(f"--sequence-parallel: --tensor {tensor} must divide --block_size {block_size}")
    padded = -(-vocab // tensor) * tensor

    def loss_fn(logits, targets):
        return vocab_parallel_cross_entropy(logits, targets, group).mean()

    specs = [LayerSpec(Embed, padded, block_size, width, group, sequence_parallel)]
    specs += [LayerSpec(TensorParallelBlock, width, heads, group, sequence_parallel) for _ in range(layers)]
    specs += [LayerSpec(Head, width, padded, group, sequence_parallel)]
    return PipelineModule(specs, topology=grid, loss_fn=loss_fn, partition_method="type:TensorParallelBlock",
                          seed_layers=True)
