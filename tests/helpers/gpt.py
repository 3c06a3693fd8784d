"""The GPT used by the GPU benchmarks: plain PyTorch, scaled-dot-product attention.

The default size is issue 7's model: 24 layers, width 1024, 16 heads, sequence 1024,
vocabulary 50304, learned positions and an untied output head, 406M parameters.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """Shape of the benchmark GPT; the defaults are the 406M model of issue 7."""

    n_layer: int = 24
    n_embd: int = 1024
    n_head: int = 16
    seq_len: int = 1024
    vocab_size: int = 50304


TINY = GPTConfig(n_layer=2, n_embd=64, n_head=4, seq_len=64, vocab_size=512)


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention through F.scaled_dot_product_attention (flash on GPU)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        shape = (batch, seq, self.n_head, width // self.n_head)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, width))


class Block(nn.Module):
    """Pre-norm transformer block: attention and a 4x GELU MLP, each with a residual."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.fc_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2 style language model; forward(idx, targets) returns the mean token loss."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.seq_len, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.loss_chunks = 1  # > 1: the head and loss run in that many checkpointed pieces
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2 init: N(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layer);
        # biases zero, LayerNorm as PyTorch builds it (ones and zeros).
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if name.endswith("proj") else 0.02
                nn.init.normal_(module.weight, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        hidden = self.ln_f(x)
        if self.loss_chunks > 1:
            from launcher.zero.checkpointing import chunked_loss
            return chunked_loss(self.token_loss_sum, hidden, targets, self.loss_chunks)
        return self.token_loss_sum(hidden.view(-1, hidden.shape[-1]), targets.reshape(-1)) / targets.numel()

    def token_loss_sum(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Summed loss of (tokens, width) hidden states; in fp32 for every variant (as autocast does)."""
        return F.cross_entropy(self.head(hidden).float(), targets, reduction="sum")


def count_params(config: GPTConfig) -> int:
    """Parameters of GPT(config), counted without building it."""
    d, layers = config.n_embd, config.n_layer
    per_block = (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d) + 4 * d
    return config.vocab_size * d * 2 + config.seq_len * d + layers * per_block + 2 * d


def flops_per_token(config: GPTConfig) -> float:
    """Model FLOPs of one token's forward and backward (PaLM convention).

    6 x the parameters of every matrix product (embedding lookups excluded, output head
    included) plus 12 x layers x width x sequence for attention scores and values.
    """
    d, layers = config.n_embd, config.n_layer
    matmul_params = layers * 12 * d * d + config.vocab_size * d
    return 6.0 * matmul_params + 12.0 * layers * d * config.seq_len


def train_on_random_tokens(engine, rank: int, steps: int, batch: int = 2) -> list[float]:
    """``steps`` engine steps of next-token loss on random tokens seeded per rank (as a tutorial
    script does); the losses. The sequence and vocabulary come from the engine's module's config."""
    config = engine.module.config
    gen = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, config.vocab_size, (batch, config.seq_len + 1), generator=gen)
        loss = engine(tokens[:, :-1], tokens[:, 1:])
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    return losses
