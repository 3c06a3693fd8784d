"""A tiny Llama and its word-level tokenizer, made from a seed and saved to a folder (nothing downloaded).

TRL's trainers take a model name and load the model, its reference copy and the tokenizer from it,
as a user's script names a Hub model; ``save_tiny_model(folder)`` writes such a folder. Words are
``t0`` ... ``t59``; a text climbs by a fixed stride from a random start, so two layers learn it.
"""
from __future__ import annotations

from pathlib import Path

import torch

WORDS, SPECIALS = 60, ["<pad>", "</s>", "<s>", "<unk>"]
VOCAB_SIZE = WORDS + len(SPECIALS)


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIALS + [f"t{i}" for i in range(WORDS)])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", bos_token="<s>",
                                   unk_token="<unk>", model_max_length=64)


def save_tiny_model(folder: Path, seed: int = 42) -> Path:
    """A two-layer Llama (width 32, grouped-query attention) and the tokenizer, saved to ``folder``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return folder


def stride_texts(count: int, length: int, seed: int) -> list[list[str]]:
    """``count`` rows of ``length`` words, each climbing by a stride of 1-3 from a random start (mod WORDS)."""
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, WORDS, (count, 1), generator=generator)
    strides = torch.randint(1, 4, (count, 1), generator=generator)
    rows = (starts + strides * torch.arange(length)) % WORDS
    return [[f"t{int(i)}" for i in row] for row in rows]


def sft_rows(count: int, seed: int) -> dict:
    return {"text": [" ".join(words) for words in stride_texts(count, 12, seed)]}


def preference_rows(count: int, seed: int) -> dict:
    """Prompts of 8 words; chosen continues the stride for 4 words, rejected is the same 4 words reversed."""
    rows = stride_texts(count, 12, seed)
    return {"prompt": [" ".join(words[:8]) for words in rows],
            "chosen": [" " + " ".join(words[8:]) for words in rows],
            "rejected": [" " + " ".join(reversed(words[8:])) for words in rows]}
