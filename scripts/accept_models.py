"""The Hugging Face models of the acceptance run (scripts/gpu_accept.py), built from their configs.

Four families a user trains with ZeRO: Llama with grouped-query attention, GPT-2 (tied head,
Conv1D layers), Qwen2 (GQA, biased q/k/v, tied head) and Mixtral (GQA, 8 experts top-2), each
about 200-300M parameters so one step of 8 x 1024 tokens keeps an H100 busy; ``tiny`` gives
2-layer versions for the CPU. Nothing is downloaded: every model is built from a config in fp32
from one seed, so every process gets the same starting weights, and kept on the CPU to copy.
Mixtral runs transformers' own experts loop (``experts_implementation="eager"``): the local
PyTorch code, the same in every dtype and transformers version, and nothing from the hub.
"""
from __future__ import annotations

import dataclasses

import torch

MODEL_NAMES = ("llama", "gpt2", "qwen2", "mixtral")
SEED, DATA_SEED = 0, 1234


@dataclasses.dataclass(frozen=True)
class Shape:
    """A run's batch: ``batch`` sequences of ``seq`` tokens a step, ``steps`` steps (the first
    ``warmup`` untimed)."""

    batch: int
    seq: int
    steps: int
    warmup: int


FULL = Shape(batch=8, seq=1024, steps=10, warmup=3)
TINY = Shape(batch=2, seq=64, steps=4, warmup=1)

_LLAMA_LIKE = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16, num_attention_heads=16,
                   vocab_size=32000, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0)
_TINY_LLAMA_LIKE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        vocab_size=512, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0)

# name -> (transformers class, full config, tiny config); dropout off everywhere (identical steps)
CONFIGS = {
    "llama": ("LlamaForCausalLM",
              dict(_LLAMA_LIKE, num_key_value_heads=4, tie_word_embeddings=False),
              dict(_TINY_LLAMA_LIKE, num_key_value_heads=2, tie_word_embeddings=False)),
    "gpt2": ("GPT2LMHeadModel",
             dict(n_embd=1024, n_layer=16, n_head=16, vocab_size=50257, n_positions=1024,
                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
             dict(n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=128, bos_token_id=0, eos_token_id=0,
                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
    "qwen2": ("Qwen2ForCausalLM",
              dict(_LLAMA_LIKE, num_key_value_heads=2, tie_word_embeddings=True, use_sliding_window=False),
              dict(_TINY_LLAMA_LIKE, num_key_value_heads=2, tie_word_embeddings=True, use_sliding_window=False)),
    "mixtral": ("MixtralForCausalLM",
                dict(hidden_size=768, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=12,
                     num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
                     max_position_embeddings=2048, tie_word_embeddings=False, router_jitter_noise=0.0,
                     sliding_window=None, experts_implementation="eager"),
                dict(_TINY_LLAMA_LIKE, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                     tie_word_embeddings=False, router_jitter_noise=0.0, sliding_window=None,
                     experts_implementation="eager")),
}


class CausalLMLoss(torch.nn.Module):
    """A causal LM called as ``(idx, targets) -> mean token loss`` (transformers' own loss, in fp32);
    ``targets`` are the labels already shifted. The model itself is ``self.lm``."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=idx, labels=targets, shift_labels=targets, use_cache=False).loss


def hf_config(name: str, tiny: bool):
    import transformers

    class_name, full, small = CONFIGS[name]
    config_class = getattr(transformers, class_name.replace("ForCausalLM", "Config").replace("LMHeadModel", "Config"))
    return class_name, config_class(**(small if tiny else full), attn_implementation="sdpa")


def build_lm(name: str, tiny: bool, device: str = "cpu") -> torch.nn.Module:
    """The causal LM in fp32 on the CPU, its weights drawn from ``SEED`` on ``device``: the same in
    every process that draws on the same kind of device (a GPU draws 250M numbers in milliseconds,
    the CPU in seconds, and each process builds each of its models once)."""
    import transformers

    class_name, config = hf_config(name, tiny)
    torch.manual_seed(SEED)
    with torch.device(device):
        lm = getattr(transformers, class_name)(config)
    return lm.to("cpu").train()


def flops_per_token(lm: torch.nn.Module, seq: int) -> float:
    """Model FLOPs of one token's forward and backward, one rule for every model and engine:
    6 x the weights of every matrix product (the head included, embedding lookups excluded;
    of the experts only the top-k share each token uses) + 12 x layers x attention width x
    sequence for the scores and values (PaLM's convention, as scripts/bench_models.py)."""
    config = lm.config
    embeddings = {id(m.weight) for m in lm.modules() if isinstance(m, torch.nn.Embedding)}
    head = lm.get_output_embeddings().weight
    active = 0.0
    for p in lm.parameters():   # each tensor once, tied ones included
        if id(p) in embeddings or p.dim() < 2:
            continue
        share = (config.num_experts_per_tok / config.num_local_experts) if p.dim() == 3 else 1.0
        active += p.numel() * share
    if id(head) in embeddings:   # a tied head is a matrix product too
        active += head.numel()
    layers = config.num_hidden_layers
    width = config.num_attention_heads * (config.hidden_size // config.num_attention_heads)
    return 6.0 * active + 12.0 * layers * width * seq


def stride_tokens(count: int, length: int, vocab: int, seed: int = DATA_SEED) -> torch.Tensor:
    """``count`` rows of ``length`` tokens that climb by a random stride (1-7) from a random start, mod
    ``vocab``: learnable, so the loss falls within a few steps and an engine that trains wrong shows."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, vocab, (count, 1), generator=gen)
    strides = torch.randint(1, 8, (count, 1), generator=gen)
    return (starts + strides * torch.arange(length)) % vocab


def batches(vocab: int, shape: Shape) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One (idx, targets) batch per step, on the CPU: every variant and engine sees the same."""
    tokens = stride_tokens(shape.steps * shape.batch, shape.seq + 1, vocab)
    return [(rows[:, :-1].contiguous(), rows[:, 1:].contiguous()) for rows in tokens.split(shape.batch)]
