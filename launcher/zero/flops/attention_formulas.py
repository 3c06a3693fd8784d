"""FLOP formulas for the fused attention kernels, grouped-query attention (GQA) included.

A GQA model (Llama 3, Mistral: fewer key/value heads than query heads; sdpa's ``enable_gqa``)
hands the kernel key and value with ``heads_kv`` heads and the query with ``heads``, a multiple
of it. The kernel reads each key/value head for ``heads / heads_kv`` query heads, so its work is
that of attention with key and value repeated to the query's heads: these formulas count that,
which is also what an explicit ``repeat_interleave`` of key and value before the kernel counts.
torch's own formulas asserted equal heads until recently (issue 39: every Llama step failed
under MFU on torch 2.11), so ours replace them for every attention op that exists in the torch
that runs, whatever its version.

Shapes are (batch, heads, sequence, head dim), 2 FLOPs per multiply-add. Causal masking is not
discounted (torch's convention, and the usual MFU convention).
"""
from __future__ import annotations

from math import prod

import torch


class AttentionShapeError(ValueError):
    """Shapes an attention formula cannot count; the counter turns it into a warning (counter.py)."""


def _dims(query_shape, key_shape, value_shape) -> tuple[int, int, int, int, int, int]:
    """(batch, heads, query length, key length, head dim, value head dim), checked."""
    if not (len(query_shape) == len(key_shape) == len(value_shape) >= 3):
        raise AttentionShapeError(f"attention shapes must be (..., heads, sequence, dim): "
                                  f"query {tuple(query_shape)}, key {tuple(key_shape)}, value {tuple(value_shape)}")
    *batch_q, heads, q_len, dim = query_shape
    *batch_k, heads_kv, k_len, k_dim = key_shape
    *batch_v, heads_v, v_len, v_dim = value_shape
    if not (batch_q == batch_k == batch_v and heads_kv == heads_v and dim == k_dim and k_len == v_len) \
            or heads_kv <= 0 or heads % heads_kv:
        raise AttentionShapeError(
            f"attention shapes do not fit (query heads must be a multiple of key/value heads): "
            f"query {tuple(query_shape)}, key {tuple(key_shape)}, value {tuple(value_shape)}")
    return prod(batch_q), heads, q_len, k_len, dim, v_dim


def attention_flops(query_shape, key_shape, value_shape) -> int:
    """Forward: scores = Q K^T and out = P V over the query's heads (GQA: key/value heads repeated)."""
    batch, heads, q_len, k_len, dim, v_dim = _dims(query_shape, key_shape, value_shape)
    return 2 * batch * heads * q_len * k_len * (dim + v_dim)


def attention_backward_flops(grad_out_shape, query_shape, key_shape, value_shape) -> int:
    """Backward of a flash-style kernel: the scores recomputed (Q K^T), then dP = dO V^T, dV = P^T dO,
    dQ = dS K, dK = dS^T Q: five products, 2 * b * h * s_q * s_k * (3 d + 2 d_v)."""
    batch, heads, q_len, k_len, dim, v_dim = _dims(query_shape, key_shape, value_shape)
    if tuple(grad_out_shape[-3:]) != (heads, q_len, v_dim):
        raise AttentionShapeError(f"attention backward: grad_out {tuple(grad_out_shape)} does not match "
                                  f"query {tuple(query_shape)} and value {tuple(value_shape)}")
    return 2 * batch * heads * q_len * k_len * (3 * dim + 2 * v_dim)


# ---- the ops: (batch, heads, sequence, dim) kernels; their first arguments are (q, k, v) forward,
# (grad_out, q, k, v) backward. FlopCounterMode hands a non-raw formula the shapes of tensor arguments.

def _forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return attention_flops(query_shape, key_shape, value_shape)


def _backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return attention_backward_flops(grad_out_shape, query_shape, key_shape, value_shape)


FORWARD_OPS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
               "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
               "_scaled_dot_product_fused_attention_overrideable")
BACKWARD_OPS = ("_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
                "_scaled_dot_product_cudnn_attention_backward", "_scaled_dot_product_flash_attention_for_cpu_backward",
                "_scaled_dot_product_fused_attention_overrideable_backward")


# ---- the kernels under them, also called directly (nested tensors): (batch, sequence, heads, dim) dense,
# (total tokens, heads, dim) with cumulative sequence offsets. "Raw" formulas: they get the tensors.

def _raw(function):
    function._get_raw = True   # FlopCounterMode's mark for a formula that takes the tensors themselves
    return function


def _lengths(offsets, longest: int) -> list[int]:
    """Sequence lengths from cumulative offsets; the longest for each where they cannot be read (fake, meta)."""
    if offsets.device.type != "meta":
        try:
            return [int(n) for n in offsets.diff().tolist()]
        except Exception:   # a fake tensor (compile's tracing) has no values
            pass
    return [int(longest)] * (offsets.shape[0] - 1)


def _sequences(query, key, value, grad_out, offsets_q, offsets_k, max_q, max_k):
    """(query, key, value, grad_out) shapes as (batch, heads, sequence, dim): the batch's, or one per sequence."""
    if offsets_q is None:
        def heads_first(shape):
            return (shape[0], shape[2], shape[1], shape[3])
        yield (heads_first(query.shape), heads_first(key.shape), heads_first(value.shape),
               heads_first(grad_out.shape) if grad_out is not None else None)
        return
    heads, dim = query.shape[-2:]
    heads_kv, v_dim = key.shape[-2], value.shape[-1]
    for q_len, k_len in zip(_lengths(offsets_q, max_q), _lengths(offsets_k, max_k)):
        yield ((1, heads, q_len, dim), (1, heads_kv, k_len, dim), (1, heads_kv, k_len, v_dim),
               (1, heads, q_len, v_dim) if grad_out is not None else None)


@_raw
def _flash_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, *args, out_val=None, **kwargs) -> int:
    return sum(attention_flops(q, k, v) for q, k, v, _ in
               _sequences(query, key, value, None, cum_seq_q, cum_seq_k, max_q, max_k))


@_raw
def _efficient_forward(query, key, value, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *args,
                       out_val=None, **kwargs) -> int:
    return sum(attention_flops(q, k, v) for q, k, v, _ in
               _sequences(query, key, value, None, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))


@_raw
def _flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, *args,
                    out_val=None, **kwargs) -> int:
    return sum(attention_backward_flops(g, q, k, v) for q, k, v, g in
               _sequences(query, key, value, grad_out, cum_seq_q, cum_seq_k, max_q, max_k))


@_raw
def _efficient_backward(grad_out, query, key, value, bias, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, *args, out_val=None, **kwargs) -> int:
    return sum(attention_backward_flops(g, q, k, v) for q, k, v, g in
               _sequences(query, key, value, grad_out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))


KERNEL_OPS = (("_flash_attention_forward", _flash_forward), ("_efficient_attention_forward", _efficient_forward),
              ("_flash_attention_backward", _flash_backward), ("_efficient_attention_backward", _efficient_backward))


def attention_formulas() -> dict:
    """{op packet: formula} for every attention op of the running torch (an op it lacks is left out).
    For FlopCounterMode's ``custom_mapping``: these win over torch's own."""
    aten = torch.ops.aten
    table = [(name, _forward) for name in FORWARD_OPS] + [(name, _backward) for name in BACKWARD_OPS]
    return {getattr(aten, name): formula for name, formula in table + list(KERNEL_OPS) if hasattr(aten, name)}
