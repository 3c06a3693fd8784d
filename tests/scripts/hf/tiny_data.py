"""The token data and the tiny Llama the Hugging Face scripts train, made from a seed (nothing downloaded).

Each sample is a run of tokens that climbs by a fixed stride from a random start (mod the vocabulary),
so a two-layer model can learn it and the loss falls within a few steps. The test process imports this
file too, to score a saved model on the same evaluation samples.
"""
from __future__ import annotations

import torch
from torch.utils.data import Dataset

VOCAB_SIZE = 64
SEQUENCE_LENGTH = 16


class StrideTokens(Dataset):
    """``count`` samples of ``{"input_ids", "labels"}``; the same ``seed`` gives the same samples."""

    def __init__(self, count: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, VOCAB_SIZE, (count, 1), generator=generator)
        strides = torch.randint(1, 4, (count, 1), generator=generator)
        self.tokens = (starts + strides * torch.arange(SEQUENCE_LENGTH)) % VOCAB_SIZE

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict:
        ids = self.tokens[index]
        return {"input_ids": ids, "labels": ids.clone()}


def llama_config():
    """A Llama small enough that a step takes milliseconds on a CPU, with grouped-query attention."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQUENCE_LENGTH,
                       tie_word_embeddings=False)


def mean_loss(model, dataset: StrideTokens, batch_size: int = 8) -> float:
    """The mean over batches of the model's causal-LM loss on ``dataset`` (how ``Trainer.evaluate`` averages)."""
    losses = []
    with torch.no_grad():
        for first in range(0, len(dataset), batch_size):
            ids = dataset.tokens[first:first + batch_size]
            losses.append(model(input_ids=ids, labels=ids).loss.item())
    return sum(losses) / len(losses)
