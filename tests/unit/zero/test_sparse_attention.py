"""SparseSelfAttention equals dense attention under the same mask (CPU: dense and flex paths)."""

import pytest
import torch
import torch.nn.functional as F

from launcher.errors import ConfigError
from launcher.zero.sparse_attention import (BigBirdSparsityConfig, DenseSparsityConfig, FixedSparsityConfig,
                                            SparseSelfAttention, VariableSparsityConfig, expand_layout)

B, H, L, D = 2, 4, 64, 16


def qkv(seed=0, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, D, generator=gen).requires_grad_(requires_grad) for _ in range(3)]


CONFIGS = {
    "fixed-uni": lambda: FixedSparsityConfig(H, block=8, num_local_blocks=2, attention="unidirectional"),
    "fixed-bi-horizontal": lambda: FixedSparsityConfig(H, block=8, num_local_blocks=4,
                                                       horizontal_global_attention=True),
    "bigbird-per-head": lambda: BigBirdSparsityConfig(H, block=8, different_layout_per_head=True, seed=1),
    "variable": lambda: VariableSparsityConfig(H, block=16, local_window_blocks=[1, 2], global_block_indices=[2]),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_equals_sdpa_with_the_expanded_mask_values_and_gradients(name):
    config = CONFIGS[name]()
    attn = SparseSelfAttention(config, max_seq_length=128)
    q, k, v = qkv(requires_grad=True)
    out = attn(q, k, v)
    layout = attn.get_layout(L)  # the max_seq_length layout cut to L (random blocks drawn once)
    mask = expand_layout(layout, config.block, causal=config.attention == "unidirectional")
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=mask)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad)
    for a, b in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_dense_layout_with_causal_is_causal_attention():
    attn = SparseSelfAttention(DenseSparsityConfig(H, block=16), max_seq_length=L, causal=True)
    q, k, v = qkv()
    torch.testing.assert_close(attn(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               rtol=1e-5, atol=1e-5)


def test_unidirectional_layout_is_causal_inside_diagonal_blocks_by_default():
    config = FixedSparsityConfig(H, block=16, attention="unidirectional")
    q, k, v = qkv()
    v_future = v.clone()
    v_future[:, :, 1:] += 100.0  # change only tokens after token 0
    attn = SparseSelfAttention(config, max_seq_length=L)
    torch.testing.assert_close(attn(q, k, v)[:, :, 0], attn(q, k, v_future)[:, :, 0])
    leaky = SparseSelfAttention(config, max_seq_length=L, causal=False)  # DeepSpeed's behaviour
    assert not torch.allclose(leaky(q, k, v)[:, :, 0], leaky(q, k, v_future)[:, :, 0])


def test_masks_follow_deepspeed_modes():
    config = FixedSparsityConfig(H, block=8, num_local_blocks=8)  # dense within 64 tokens
    q, k, v = qkv()
    keep = torch.ones(B, L)
    keep[0, 40:] = 0
    attn_keep = torch.ones(L, L).tril()
    rpe = torch.randn(L, L)
    mul = SparseSelfAttention(config, key_padding_mask_mode="mul", attn_mask_mode="mul", max_seq_length=L)
    add = SparseSelfAttention(config, key_padding_mask_mode="add", attn_mask_mode="add", max_seq_length=L)
    neg = lambda m: torch.zeros_like(m).masked_fill(m == 0, float("-inf"))  # noqa: E731
    bias = neg(keep)[:, None, None, :] + neg(attn_keep) + rpe
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    torch.testing.assert_close(mul(q, k, v, rpe=rpe, key_padding_mask=keep, attn_mask=attn_keep), ref,
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(add(q, k, v, rpe=rpe, key_padding_mask=neg(keep), attn_mask=neg(attn_keep)), ref,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", ["fixed-uni", "bigbird-per-head"])
def test_flex_path_equals_dense_path(name):
    # flex_attention runs forward-only on CPU (eager); on CUDA the same code is compiled.
    config = CONFIGS[name]()
    flex = SparseSelfAttention(config, max_seq_length=L, key_padding_mask_mode="mul", backend="flex")
    dense = SparseSelfAttention(config, max_seq_length=L, key_padding_mask_mode="mul", backend="dense")
    dense.master_layout.copy_(flex.master_layout)
    q, k, v = qkv(seed=3)
    keep = torch.ones(B, L)
    keep[1, :] = 0  # batch 1 may attend to nothing: both paths give zeros
    with torch.no_grad():
        got = flex(q, k, v, key_padding_mask=keep)
        want = dense(q, k, v, key_padding_mask=keep)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert want[1].abs().max() == 0


def test_shapes_are_checked():
    attn = SparseSelfAttention(FixedSparsityConfig(H, block=16), max_seq_length=64)
    q = torch.randn(1, H, 128, D)
    with pytest.raises(ConfigError, match="max_seq_length"):
        attn(q, q, q)
    q = torch.randn(1, H, 40, D)
    with pytest.raises(ConfigError, match="divisible"):
        attn(q, q, q)
    with pytest.raises(ConfigError, match="one shape"):
        attn(q, q, q[:, :, :32])
    with pytest.raises(ConfigError, match="mask modes"):
        SparseSelfAttention(key_padding_mask_mode="xor")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["fixed-uni", "bigbird-per-head"])
def test_compiled_flex_on_cuda_equals_dense_path_values_and_gradients(name):
    config = CONFIGS[name]()
    flex = SparseSelfAttention(config, max_seq_length=512, key_padding_mask_mode="mul").cuda()
    dense = SparseSelfAttention(config, max_seq_length=512, key_padding_mask_mode="mul", backend="dense").cuda()
    dense.master_layout.copy_(flex.master_layout)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, H, 512, 64, device="cuda", generator=gen, requires_grad=True) for _ in range(3))
    keep = torch.ones(2, 512, device="cuda")
    keep[0, 300:] = 0
    out = flex(q, k, v, key_padding_mask=keep)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = dense(q, k, v, key_padding_mask=keep)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
