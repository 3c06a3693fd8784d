"""Attention FLOPs with grouped-query attention (issue 39): every sdpa kernel, CPU and CUDA, counts a
GQA call as attention with key/value repeated to the query's heads, whatever torch's own formulas
say, and a Hugging Face Llama with GQA trains with MFU on (it failed at its first step on an H100)."""
import pytest
import torch
import torch.nn.functional as F

import torch.utils.flop_counter as torch_flop_counter
from launcher.zero.flops.attention_formulas import (BACKWARD_OPS, FORWARD_OPS, AttentionShapeError,
                                                    attention_backward_flops, attention_flops, attention_formulas)
from launcher.zero.flops.counter import FlopCounter, count_flops

aten = torch.ops.aten
BATCH, HEADS, HEADS_KV, SEQ, DIM = 2, 8, 2, 16, 32


def hand_forward(b, h, s_q, s_k, d, d_v):
    return 2 * b * h * s_q * s_k * d + 2 * b * h * s_q * s_k * d_v          # Q K^T, P V


def hand_backward(b, h, s_q, s_k, d, d_v):
    # scores recomputed (Q K^T), dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q
    return 2 * b * h * s_q * s_k * (d + d_v + d_v + d + d)


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def qkv(device="cpu", requires_grad=False, heads_kv=HEADS_KV, v_dim=DIM):
    make = (lambda *s: torch.empty(*s, device="meta")) if device == "meta" else torch.randn
    q, k, v = make(BATCH, HEADS, SEQ, DIM), make(BATCH, heads_kv, SEQ, DIM), make(BATCH, heads_kv, SEQ, v_dim)
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))


def test_the_formulas_count_gqa_as_heads_repeated_and_refuse_shapes_that_do_not_fit():
    q, k, v = (BATCH, HEADS, SEQ, DIM), (BATCH, HEADS_KV, SEQ, DIM), (BATCH, HEADS_KV, SEQ, 48)
    assert attention_flops(q, k, v) == hand_forward(BATCH, HEADS, SEQ, SEQ, DIM, 48)
    assert attention_backward_flops((BATCH, HEADS, SEQ, 48), q, k, v) == hand_backward(BATCH, HEADS, SEQ, SEQ, DIM, 48)
    repeated = (BATCH, HEADS, SEQ, DIM)
    assert attention_flops(q, k, v) == attention_flops(q, repeated, (BATCH, HEADS, SEQ, 48))
    with pytest.raises(AttentionShapeError, match="multiple"):
        attention_flops((BATCH, 6, SEQ, DIM), (BATCH, 4, SEQ, DIM), (BATCH, 4, SEQ, DIM))


def test_every_sdpa_kernel_of_this_torch_has_our_formula():
    formulas = attention_formulas()
    for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
                 "_scaled_dot_product_flash_attention_for_cpu_backward", "_flash_attention_forward"):
        assert getattr(aten, name) in formulas, name
    assert all(getattr(aten, name) in formulas for name in FORWARD_OPS + BACKWARD_OPS if hasattr(aten, name))


def test_sdpa_with_enable_gqa_on_cpu_counts_like_an_explicit_repeat_interleave():
    q, k, v = qkv(requires_grad=True)
    grouped = count_flops(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True)
                          .sum().backward())
    groups = HEADS // HEADS_KV
    repeated = count_flops(lambda: F.scaled_dot_product_attention(
        q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1), is_causal=True).sum().backward())
    assert grouped.failure is None and repeated.failure is None
    assert grouped.total == repeated.total == (hand_forward(BATCH, HEADS, SEQ, SEQ, DIM, DIM)
                                               + hand_backward(BATCH, HEADS, SEQ, SEQ, DIM, DIM))


def equal_heads_only(query_shape, key_shape, *args, **kwargs):
    """torch 2.11's attention formulas: equal heads asserted (what the H100 run met)."""
    raise AssertionError("sdpa_flop_count: query/key/value shapes are incompatible")


@pytest.mark.parametrize("torch_formulas", ["installed", "equal heads only"])
@pytest.mark.parametrize("name, extra", [
    ("_scaled_dot_product_flash_attention", ()), ("_scaled_dot_product_efficient_attention", (None, True)),
    ("_scaled_dot_product_cudnn_attention", (None, True)), ("_scaled_dot_product_flash_attention_for_cpu", ())])
def test_the_cuda_and_cpu_kernels_count_gqa_whatever_torchs_own_formulas_say(monkeypatch, torch_formulas, name, extra):
    """The kernels run on meta tensors (shapes only), so the CUDA ones are counted on a CPU machine."""
    if not hasattr(aten, name):
        pytest.skip(f"{name} is not in torch {torch.__version__}")
    if torch_formulas == "equal heads only":
        for op in list(torch_flop_counter.flop_registry):
            if "attention" in str(op):
                monkeypatch.setitem(torch_flop_counter.flop_registry, op, equal_heads_only)
    op = getattr(aten, name)
    q, k, v = qkv("meta")
    counted = count_flops(lambda: op(q, k, v, *extra))
    assert counted.failure is None and counted.total == hand_forward(BATCH, HEADS, SEQ, SEQ, DIM, DIM)
    groups = HEADS // HEADS_KV
    assert count_flops(lambda: op(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), *extra)).total \
        == counted.total
    backward = getattr(aten, name + "_backward")
    formula = FlopCounter()
    formula.start()
    try:
        registry = formula._mode.flop_registry
        grad = torch.empty(BATCH, HEADS, SEQ, DIM, device="meta")
        assert registry[backward](grad, q, k, v, out_val=None) == hand_backward(BATCH, HEADS, SEQ, SEQ, DIM, DIM)
    finally:
        assert formula.stop().failure is None


def test_the_varlen_kernels_count_each_sequence_with_its_own_length():
    lengths, total = [5, 11], 16
    q = torch.empty(total, HEADS, DIM, device="meta")
    k = v = torch.empty(total, HEADS_KV, DIM, device="meta")
    offsets = torch.tensor([0, 5, 16], dtype=torch.int32)
    formula = attention_formulas()[aten._flash_attention_forward]
    assert formula(q, k, v, offsets, offsets, 11, 11) == sum(hand_forward(1, HEADS, n, n, DIM, DIM) for n in lengths)
    dense = torch.empty(BATCH, SEQ, HEADS, DIM), torch.empty(BATCH, SEQ, HEADS_KV, DIM)   # (b, s, h, d) layout
    assert formula(dense[0], dense[1], dense[1], None, None, SEQ, SEQ) == hand_forward(BATCH, HEADS, SEQ, SEQ, DIM, DIM)


def llama_flops(config, batch: int, seq: int) -> int:
    """One training step of LlamaForCausalLM: its linear layers' products (forward, then twice in backward)
    and attention at the query's heads (GQA: key/value heads repeated), 2 FLOPs per multiply-add."""
    hidden, head_dim = config.hidden_size, config.hidden_size // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    per_layer = hidden * hidden * 2 + hidden * kv * 2 + 3 * hidden * config.intermediate_size
    linear = config.num_hidden_layers * per_layer + hidden * config.vocab_size
    shape = (batch, config.num_attention_heads, seq, seq, head_dim, head_dim)
    attention = config.num_hidden_layers * (hand_forward(*shape) + hand_backward(*shape))
    return 6 * linear * batch * seq + attention


@pytest.mark.parametrize("stage", [0, 3])
def test_a_hugging_face_llama_with_gqa_trains_with_mfu_on(monkeypatch, capsys, stage):
    transformers = pytest.importorskip("transformers")
    from launcher import zero

    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    assert model.config._attn_implementation == "sdpa"
    monkeypatch.setenv("DSLAUNCH_PEAK_TFLOPS", "1e-6")
    engine, *_ = zero.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(3):
        ids = torch.randint(0, 128, (2, 16), generator=gen)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    engine.destroy()
    assert engine.instruments.flops_per_step == llama_flops(config, 2, 16)
    out, err = capsys.readouterr()
    assert "warning" not in err and all(loss == loss for loss in losses)
    progress = [line for line in out.splitlines() if " progress " in line]
    assert len(progress) == 3 and all("mfu=" in line for line in progress)
