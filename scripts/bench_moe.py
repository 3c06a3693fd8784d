"""The bench's Mixture-of-Experts GPT (issue 31 item 5): the benchmark GPT with every other
block's MLP replaced by an MoE layer (8 experts of that MLP's shape, top-2, ep 1, DeepSpeed's
default capacity), built with our ``launcher.zero.moe`` layer or DeepSpeed's ``deepspeed.moe``.

Both layers build their modules in the same order (experts, then the gate), so one seed gives one
set of initial weights: the ``ds_*`` variants train the same model as ours. The load-balancing
loss of each MoE layer is added to the token loss times ``AUX_LOSS_COEF`` (DeepSpeed's examples).

    python scripts/bench_engine.py --model moe --batch 8 --variants plain,zero2,ds_zero2
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

AUX_LOSS_COEF = 0.01


class ExpertMLP(nn.Module):
    """One expert: the benchmark GPT's 4x GELU MLP."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.fc_proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_proj(F.gelu(self.fc(x), approximate="tanh"))


class MoEBlock(nn.Module):
    """Pre-norm block whose MLP is an MoE layer; forward returns (hidden, l_aux)."""

    def __init__(self, config, moe_class, experts: int, k: int):
        super().__init__()
        from tests.helpers.gpt import CausalSelfAttention

        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.moe = moe_class(hidden_size=config.n_embd, expert=ExpertMLP(config.n_embd), num_experts=experts,
                             ep_size=1, k=k)

    def forward(self, x: torch.Tensor):
        x = x + self.attn(self.ln_1(x))
        out, l_aux, _ = self.moe(self.ln_2(x))
        return x + out, l_aux


class MoEGPT(nn.Module):
    """The GPT of tests/helpers/gpt.py with an MoE block at every odd position."""

    def __init__(self, config, moe_class, experts: int = 8, k: int = 2):
        super().__init__()
        from tests.helpers.gpt import Block

        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.seq_len, config.n_embd)
        self.blocks = nn.ModuleList(MoEBlock(config, moe_class, experts, k) if i % 2 else Block(config)
                                    for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        aux = 0.0
        for block in self.blocks:
            if isinstance(block, MoEBlock):
                x, l_aux = block(x)
                aux = aux + l_aux
            else:
                x = block(x)
        logits = self.head(self.ln_f(x)).float()
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        return loss + AUX_LOSS_COEF * aux


def moe_flops_per_token(config, experts: int, k: int) -> float:
    """Model FLOPs of one token's forward and backward: attention's matrices in every layer, the
    dense MLP in the even ones, ``k`` experts' MLPs and the gate in the odd ones, the head, and
    12 x layers x width x sequence for attention scores and values (PaLM's convention)."""
    d, layers = config.n_embd, config.n_layer
    moe_layers = layers // 2
    matmul = layers * 4 * d * d + (layers - moe_layers) * 8 * d * d + moe_layers * (k * 8 * d * d + d * experts)
    return 6.0 * (matmul + config.vocab_size * d) + 12.0 * layers * d * config.seq_len


def build_moe_gpt(args, device: torch.device, deepspeed_layer: bool = False):
    """The bench's BuiltModel of the MoE GPT (``args``: the GPT's shape, ``experts``, ``top_k``)."""
    from bench_models import BuiltModel
    from tests.helpers.gpt import GPTConfig

    if deepspeed_layer:
        from deepspeed.moe.layer import MoE
    else:
        from launcher.zero.moe.layer import MoE
    config = GPTConfig(n_layer=args.layers, n_embd=args.width, n_head=args.heads, seq_len=args.seq,
                       vocab_size=args.vocab)
    with torch.device(device):
        module = MoEGPT(config, MoE, args.experts, args.top_k)
    params = sum(p.numel() for p in module.parameters())
    return BuiltModel(module, params, moe_flops_per_token(config, args.experts, args.top_k), config.vocab_size,
                      args.seq)
