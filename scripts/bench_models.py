"""The models the benchmarks train: our GPT (tests/helpers/gpt.py), Hugging Face's
``LlamaForCausalLM`` built from a config (issue 32 item 2: a model no one here wrote), and the
GPT with a Mixture-of-Experts layer in place of every other block's MLP (issue 31 item 5:
8 experts, top-2, ep 1), built with our ``launcher.zero.moe`` layer or DeepSpeed's
``deepspeed.moe`` one, the same shapes and seed (bench_moe.py).

Every model is called as ``model(idx, targets)`` and returns the mean token loss, so the
variants of bench_variants.py train either one unchanged. Llama computes its loss itself
(transformers' causal-LM loss, in fp32): ``targets`` go in as its already shifted labels.
"""
from __future__ import annotations

import dataclasses

import torch

# Llama 3.2 1B's shape (GQA: 32 query heads, 8 key/value heads; tied embeddings): 1.24B parameters
LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                tie_word_embeddings=True, rms_norm_eps=1e-5)
LLAMA_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, max_position_embeddings=256, rope_theta=10000.0,
                  tie_word_embeddings=True, rms_norm_eps=1e-5)


@dataclasses.dataclass(frozen=True)
class BuiltModel:
    """A model and what the bench reports about it."""

    module: torch.nn.Module
    params: int
    flops_per_token: float    # model FLOPs of one token's forward and backward
    vocab_size: int
    seq_len: int


class LlamaLoss(torch.nn.Module):
    """``LlamaForCausalLM`` called as ``(idx, targets) -> loss``; the causal LM is ``self.lm``."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # labels only switch the loss on; shift_labels are the targets, already shifted
        return self.lm(input_ids=idx, labels=targets, shift_labels=targets, use_cache=False).loss


def llama_flops_per_token(config: dict, seq_len: int) -> float:
    """6 x the parameters of every matrix product (head included, embedding lookup excluded) plus
    12 x layers x width x sequence for attention scores and values (PaLM's convention)."""
    d, layers = config["hidden_size"], config["num_hidden_layers"]
    head_dim = d // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * config["intermediate_size"]
    return 6.0 * (layers * per_layer + config["vocab_size"] * d) + 12.0 * layers * d * seq_len


def llama_config(preset: str, seq_len: int) -> dict:
    base = {"1b": LLAMA_1B, "tiny": LLAMA_TINY}[preset]
    return dict(base, max_position_embeddings=max(base["max_position_embeddings"], seq_len))


def build(kind: str, args, device: torch.device, deepspeed_layer: bool = False) -> BuiltModel:
    """``kind`` "gpt" (``args``: layers, width, heads, seq, vocab), "llama" (``args.llama``:
    "1b" or "tiny", ``args.seq``) or "moe" (the GPT's shape with ``args.experts`` experts, top
    ``args.top_k``; ``deepspeed_layer``: DeepSpeed's MoE layer, for the ``ds_*`` variants); built on
    ``device`` in fp32 from seed 0 (seeded by the caller)."""
    if kind == "gpt":
        from tests.helpers.gpt import GPT, GPTConfig, count_params, flops_per_token

        config = GPTConfig(n_layer=args.layers, n_embd=args.width, n_head=args.heads, seq_len=args.seq,
                           vocab_size=args.vocab)
        with torch.device(device):
            module = GPT(config)
        return BuiltModel(module, count_params(config), flops_per_token(config), config.vocab_size, args.seq)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = llama_config(args.llama, args.seq)
        with torch.device(device):
            lm = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="sdpa"))
        params = sum(p.numel() for p in lm.parameters())
        return BuiltModel(LlamaLoss(lm), params, llama_flops_per_token(config, args.seq), config["vocab_size"],
                          args.seq)
    if kind == "qwen2":   # the acceptance run's Qwen2 (GQA 16/2, biased q/k/v, tied head): its step time alone
        import accept_models

        lm = accept_models.build_lm("qwen2", tiny=args.llama == "tiny", device=str(device)).to(device)
        params = sum(p.numel() for p in lm.parameters())
        return BuiltModel(LlamaLoss(lm), params, accept_models.flops_per_token(lm, args.seq), lm.config.vocab_size,
                          args.seq)
    if kind == "moe":
        from bench_moe import build_moe_gpt

        return build_moe_gpt(args, device, deepspeed_layer=deepspeed_layer)
    raise ValueError(f"unknown model {kind!r}: gpt, llama, qwen2 or moe")


def enable_checkpointing(built: BuiltModel) -> None:
    """Activation checkpointing the model's own way (Hugging Face's ``gradient_checkpointing_enable``)."""
    lm = getattr(built.module, "lm", None)
    if lm is None or not hasattr(lm, "gradient_checkpointing_enable"):
        raise ValueError("--grad-ckpt: only the llama model has gradient_checkpointing_enable()")
    lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
