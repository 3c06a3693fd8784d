"""CPUAdam equals torch.optim.AdamW / Adam, whatever the threading and chunking."""

import pytest
import torch

from launcher.zero.optim.cpu_adam import CPUAdam, adam_step_flat


def run(make_opt, shapes=((1000,), (37, 11), (5,)), steps=6, wd=0.1, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]
    grads = [[torch.randn(*s, generator=g) for s in shapes] for _ in range(steps)]
    opt = make_opt(params, wd)
    for step in range(steps):
        for p, gr in zip(params, grads[step]):
            p.grad = gr.clone()
        opt.step()
    return params, opt


def max_diff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))


KW = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8)


@pytest.mark.parametrize("threads,chunk,fused", [(1, 1 << 20, True), (3, 64, True), (2, 100, False), (1, 7, False)])
def test_adamw_mode_equals_torch_adamw(threads, chunk, fused):
    ref, ref_opt = run(lambda p, wd: torch.optim.AdamW(p, weight_decay=wd, foreach=False, **KW))
    ours, opt = run(lambda p, wd: CPUAdam(p, weight_decay=wd, num_threads=threads, chunk_elements=chunk,
                                          use_fused=fused, **KW))
    assert max_diff(ref, ours) < 1e-6
    for p_ref, p in zip(ref, ours):
        assert torch.allclose(ref_opt.state[p_ref]["exp_avg_sq"], opt.state[p]["exp_avg_sq"], atol=1e-8)
        assert float(opt.state[p]["step"]) == 6


@pytest.mark.parametrize("fused", [True, False])
def test_adam_mode_equals_torch_adam_with_l2(fused):
    ref, _ = run(lambda p, wd: torch.optim.Adam(p, weight_decay=wd, foreach=False, **KW))
    ours, _ = run(lambda p, wd: CPUAdam(p, weight_decay=wd, adamw_mode=False, num_threads=2, chunk_elements=50,
                                        use_fused=fused, **KW))
    assert max_diff(ref, ours) < 1e-6
    # and decoupled decay is really different, so the mode flag matters
    decoupled, _ = run(lambda p, wd: CPUAdam(p, weight_decay=wd, adamw_mode=True, **KW))
    assert max_diff(ref, decoupled) > 1e-5


def test_16bit_copy_is_written_for_every_chunk():
    p = torch.nn.Parameter(torch.randn(1000))
    p.grad = torch.randn(1000)
    out = torch.zeros(1000, dtype=torch.bfloat16)
    opt = CPUAdam([p], num_threads=3, chunk_elements=64, **KW)
    opt.step(params_16bit={p: out})
    assert torch.equal(out, p.detach().to(torch.bfloat16))


def test_params_without_grad_are_left_alone_and_state_dict_round_trips():
    a, b = torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.ones(4))
    a.grad = torch.ones(4)
    opt = CPUAdam([a, b], **KW)
    opt.step()
    assert torch.equal(b.detach(), torch.ones(4)) and not torch.equal(a.detach(), torch.ones(4))
    sd = opt.state_dict()
    ref = torch.optim.AdamW([a, b], **KW)
    ref.load_state_dict(sd)       # torch's AdamW accepts our state unchanged
    assert float(ref.state[a]["step"]) == 1


def test_flat_function_matches_the_optimizer():
    p = torch.randn(300)
    g = torch.randn(300)
    m, v = torch.zeros(300), torch.zeros(300)
    ref = torch.nn.Parameter(p.clone())
    ref.grad = g.clone()
    torch.optim.AdamW([ref], weight_decay=0.01, foreach=False, **KW).step()
    adam_step_flat(p, g, m, v, step=1, weight_decay=0.01, **KW)
    assert (p - ref.detach()).abs().max() < 1e-7


def test_rejects_fp16_or_bad_hyper_parameters():
    half = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))   # bf16 steps (test_bf16_states.py)
    half.grad = torch.ones(2, dtype=torch.float16)
    with pytest.raises(ValueError):
        CPUAdam([half]).step()
    with pytest.raises(ValueError):
        CPUAdam([torch.nn.Parameter(torch.ones(2))], betas=(1.0, 0.9))


def test_grad_factor_scales_the_gradients_inside_the_update_for_one_step():
    torch.manual_seed(0)
    grad = torch.randn(1000)
    a, b = torch.nn.Parameter(torch.randn(1000)), None
    b = torch.nn.Parameter(a.detach().clone())
    a.grad, b.grad = grad * 0.25, grad.clone()
    scaled_first = CPUAdam([a], lr=0.1, weight_decay=0.1, num_threads=2, chunk_elements=300)
    factor_inside = CPUAdam([b], lr=0.1, weight_decay=0.1, num_threads=2, chunk_elements=300)
    scaled_first.step()
    factor_inside.grad_factor = 0.25
    factor_inside.step()
    assert torch.allclose(a, b, rtol=0, atol=1e-7)
    assert factor_inside.grad_factor == 1.0


def test_on_chunk_reports_every_chunk_in_order():
    p = torch.nn.Parameter(torch.randn(1000))
    q = torch.nn.Parameter(torch.randn(250))
    p.grad, q.grad = torch.randn(1000), torch.randn(250)
    seen = []
    opt = CPUAdam([p, q], lr=0.1, num_threads=2, chunk_elements=300)
    opt.on_chunk = lambda param, start, end: seen.append((param is p, start, end))
    opt.step()
    assert seen == [(True, 0, 300), (True, 300, 600), (True, 600, 900), (True, 900, 1000), (False, 0, 250)]


def test_chunk_priority_reorders_chunks_across_parameters_but_never_within_one():
    first, second = torch.zeros(300), torch.zeros(100)
    for p in (first, second):
        p.grad = torch.ones_like(p)
    adam = CPUAdam([first, second], lr=0.1, chunk_elements=100)
    seen = []
    adam.on_chunk = lambda param, start, end: seen.append((param is second, start))
    # the second parameter ranks between the first one's chunks; a chunk ranked lower than its
    # predecessor in the same parameter (start 200) still comes after it
    adam.chunk_priority = lambda param, start, end: (1.5 if param is second else {0: 1, 100: 2, 200: 0}[start])
    adam.step()
    assert seen == [(False, 0), (True, 0), (False, 100), (False, 200)]
    assert torch.allclose(first, torch.full((300,), -0.1)) and torch.allclose(second, torch.full((100,), -0.1))
