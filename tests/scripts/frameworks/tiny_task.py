"""The task the Lightning scripts train: a tiny next-token model on stride sequences, all from a seed.

torch only (no transformers): each sample is a run of tokens that climbs by a fixed stride from a
random start, and the model (embedding, one hidden layer, output) learns to predict the next token.
The test process imports this file too, to score a consolidated state dict on the same data.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

VOCAB_SIZE, WIDTH, SEQUENCE_LENGTH = 64, 32, 16


class StrideTokens(Dataset):
    """``count`` token rows; the same ``seed`` gives the same rows."""

    def __init__(self, count: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, VOCAB_SIZE, (count, 1), generator=generator)
        strides = torch.randint(1, 4, (count, 1), generator=generator)
        self.tokens = (starts + strides * torch.arange(SEQUENCE_LENGTH)) % VOCAB_SIZE

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.tokens[index]


class TinyLM(nn.Module):
    """Embedding, a GELU hidden layer and an output layer: about 8k parameters in four tensors and two biases."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB_SIZE, WIDTH)
        self.hidden = nn.Linear(WIDTH, 2 * WIDTH)
        self.out = nn.Linear(2 * WIDTH, VOCAB_SIZE)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """The mean next-token cross entropy of a batch of rows."""
        logits = self.out(torch.nn.functional.gelu(self.hidden(self.embed(tokens[:, :-1]))))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB_SIZE), tokens[:, 1:].reshape(-1))


def mean_loss(model: nn.Module, dataset: StrideTokens) -> float:
    with torch.no_grad():
        return model(dataset.tokens).item()
