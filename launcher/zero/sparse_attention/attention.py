"""SparseSelfAttention: block-sparse attention under a SparsityConfig layout.

On CUDA it runs torch's flex_attention (compiled) with a BlockMask built from the layout, so
blocks outside the layout cost nothing. Elsewhere it runs the same mask densely (the
reference the flex path is tested against). Both give 0 for a query that may attend to no key.

Masks follow DeepSpeed: `key_padding_mask` (batch, seq) and `attn_mask` (seq, seq) are either
added to the scores ('add') or mark kept positions with nonzero ('mul'); `rpe` (seq, seq) is
added. One difference: with a unidirectional layout the module also masks future tokens
inside the diagonal blocks (causal=None means "when the layout is unidirectional");
DeepSpeed left that to an attn_mask, and a GPT without one saw the future.
"""

import functools

import torch
import torch.distributed as dist

from launcher.zero.errors import ConfigError
from launcher.zero.sparse_attention.sparsity_config import DenseSparsityConfig, SparsityConfig

MASK_MODES = ("add", "mul")


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def expand_layout(layout: torch.Tensor, block: int, causal: bool) -> torch.Tensor:
    """Token-level bool mask (heads, seq, seq) of a block layout (heads, blocks, blocks)."""
    keep = layout.bool().repeat_interleave(block, dim=1).repeat_interleave(block, dim=2)
    if causal:
        keep = keep & torch.ones(keep.shape[-2:], dtype=torch.bool, device=keep.device).tril()
    return keep


def _as_bias(mask, mode, dtype):
    """An additive float bias from a DeepSpeed-style mask: 'add' as is, 'mul' 0 -> -inf."""
    if mask is None:
        return None
    if mode == "add":
        return mask.to(dtype)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask == 0, float("-inf"))


def dense_block_sparse_attention(q, k, v, keep, key_padding_bias=None, attn_bias=None):
    """Softmax(q k^T / sqrt(d) + biases) v where the token mask `keep` (heads or 1, L, L) allows."""
    scores = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    if key_padding_bias is not None:
        scores = scores + key_padding_bias.float()[:, None, None, :]
    if attn_bias is not None:
        scores = scores + attn_bias.float()
    scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a fully masked row attends to nothing
    return (probs.to(v.dtype) @ v).to(q.dtype)


class SparseSelfAttention(torch.nn.Module):
    """Block-sparse self-attention; forward(query, key, value) with (batch, heads, seq, head_dim)."""

    def __init__(self, sparsity_config: SparsityConfig | None = None, key_padding_mask_mode="add",
                 attn_mask_mode="mul", max_seq_length=2048, causal=None, backend="auto"):
        super().__init__()
        if key_padding_mask_mode not in MASK_MODES or attn_mask_mode not in MASK_MODES:
            raise ConfigError(f"mask modes must be 'add' or 'mul', got {key_padding_mask_mode!r} "
                              f"and {attn_mask_mode!r}")
        if backend not in ("auto", "flex", "dense"):
            raise ConfigError(f"backend must be 'auto', 'flex' or 'dense', got {backend!r}")
        self.sparsity_config = sparsity_config if sparsity_config is not None else DenseSparsityConfig(num_heads=4)
        self.key_padding_mask_mode = key_padding_mask_mode
        self.attn_mask_mode = attn_mask_mode
        self.causal = (self.sparsity_config.attention == "unidirectional") if causal is None else bool(causal)
        self.backend = backend
        layout = self.sparsity_config.make_layout(max_seq_length)
        if not self.sparsity_config.different_layout_per_head:
            layout = layout[:1]  # one layout shared by all heads: store it once
        self.register_buffer("master_layout", layout.to(torch.bool), persistent=False)  # random layouts: pass a seed
        self._layout_synchronized = False
        self._masks = {}

    def get_layout(self, seq_len: int) -> torch.Tensor:
        """The (heads or 1, blocks, blocks) layout for seq_len; the same on every rank."""
        if not self._layout_synchronized and dist.is_available() and dist.is_initialized():
            synced = self.master_layout.to(torch.uint8)
            if dist.get_backend() == "nccl":
                synced = synced.cuda()
            dist.broadcast(synced, src=0)
            self.master_layout.copy_(synced.to(self.master_layout.device).bool())
            self._layout_synchronized = True
        num_blocks = self.sparsity_config.num_blocks(seq_len)
        if num_blocks > self.master_layout.shape[-1]:
            raise ConfigError(f"sequence length {seq_len} exceeds max_seq_length "
                              f"{self.master_layout.shape[-1] * self.sparsity_config.block}",
                              hint="build SparseSelfAttention with a larger max_seq_length")
        return self.master_layout[:, :num_blocks, :num_blocks]

    def _token_mask(self, seq_len, device):
        key = ("dense", seq_len, str(device))
        if key not in self._masks:
            layout = self.get_layout(seq_len).to(device)
            self._masks[key] = expand_layout(layout, self.sparsity_config.block, self.causal)
        return self._masks[key]

    def _block_mask(self, seq_len, num_heads, device):
        key = (seq_len, num_heads, str(device))
        if key not in self._masks:
            from torch.nn.attention.flex_attention import create_block_mask

            layout = self.get_layout(seq_len).to(device)
            block, causal, per_head = self.sparsity_config.block, self.causal, layout.shape[0] > 1

            def mask_mod(b, h, q_idx, kv_idx):
                keep = layout[h if per_head else 0, q_idx // block, kv_idx // block]
                return keep & (q_idx >= kv_idx) if causal else keep

            self._masks[key] = create_block_mask(mask_mod, B=None, H=num_heads if per_head else None,
                                                       Q_LEN=seq_len, KV_LEN=seq_len, device=device)
        return self._masks[key]

    def _use_flex(self, query) -> bool:
        if self.backend == "auto":
            return query.is_cuda
        return self.backend == "flex"

    def forward(self, query, key, value, rpe=None, key_padding_mask=None, attn_mask=None):
        if query.dim() != 4 or query.shape != key.shape or key.shape != value.shape:
            raise ConfigError("SparseSelfAttention expects query, key and value of one shape "
                              f"(batch, heads, seq, head_dim); got {tuple(query.shape)}, {tuple(key.shape)}, "
                              f"{tuple(value.shape)}")
        batch, num_heads, seq_len, _ = query.shape
        if self.sparsity_config.different_layout_per_head and num_heads != self.sparsity_config.num_heads:
            raise ConfigError(f"the layout has {self.sparsity_config.num_heads} heads, the input {num_heads}")
        key_padding_bias = _as_bias(key_padding_mask, self.key_padding_mask_mode, torch.float32)
        if key_padding_bias is not None:
            key_padding_bias = key_padding_bias.reshape(batch, seq_len)
        attn_bias = _as_bias(attn_mask, self.attn_mask_mode, torch.float32)
        if rpe is not None:
            attn_bias = rpe.float() if attn_bias is None else attn_bias + rpe.float()
        if attn_bias is not None and attn_bias.shape[-2:] != (seq_len, seq_len):
            raise ConfigError(f"attn_mask and rpe must be ({seq_len}, {seq_len}), got {tuple(attn_bias.shape)}")
        if attn_bias is not None:
            attn_bias = attn_bias.reshape(seq_len, seq_len)
        if not self._use_flex(query):
            return dense_block_sparse_attention(query, key, value, self._token_mask(seq_len, query.device),
                                                key_padding_bias, attn_bias)
        return self._flex_forward(query, key, value, key_padding_bias, attn_bias)

    def _flex_forward(self, query, key, value, key_padding_bias, attn_bias):
        from torch.nn.attention.flex_attention import flex_attention

        block_mask = self._block_mask(query.shape[-2], query.shape[1], query.device)
        score_mod = None
        if key_padding_bias is not None or attn_bias is not None:
            kp = key_padding_bias.to(query.device) if key_padding_bias is not None else None
            ab = attn_bias.to(query.device) if attn_bias is not None else None

            def score_mod(score, b, h, q_idx, kv_idx):
                if kp is not None:
                    score = score + kp[b, kv_idx]
                if ab is not None:
                    score = score + ab[q_idx, kv_idx]
                return score

        attend = _compiled_flex() if query.is_cuda else flex_attention
        return attend(query, key, value, score_mod=score_mod, block_mask=block_mask)
