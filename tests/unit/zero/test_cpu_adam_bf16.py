"""Our CPU Adam over bf16 weights (issue 43 item 3): DeepSpeedCPUAdam's ``fp32_optimizer_states``, with
DeepSpeed 0.19.8's arithmetic (csrc/includes/cpu_adam.h: fp32 on the values read, each result rounded
to nearest even into its tensor's dtype)."""
import pytest
import torch

from launcher.zero.optim.adam import DeepSpeedCPUAdam
from launcher.zero.optim.cpu_adam import CPUAdam


def _bf16_reference(param, grads, fp32_moments: bool, lr=1e-2, wd=0.1, betas=(0.9, 0.99), eps=1e-8):
    """DeepSpeed's CPU Adam over bf16 weights (csrc/includes/cpu_adam.h): fp32 arithmetic on the
    values read, each result rounded to nearest-even into its tensor's dtype."""
    moment_dtype = torch.float32 if fp32_moments else torch.bfloat16
    m = torch.zeros_like(param, dtype=moment_dtype)
    v = torch.zeros_like(param, dtype=moment_dtype)
    for step, grad in enumerate(grads, start=1):
        p32, g32, m32, v32 = param.float(), grad.float(), m.float(), v.float()
        m32 = m32 * betas[0] + g32 * (1 - betas[0])
        v32 = v32 * betas[1] + g32 * g32 * (1 - betas[1])
        denom = v32.sqrt() / (1 - betas[1] ** step) ** 0.5 + eps
        p32 = p32 * (1 - lr * wd) - lr / (1 - betas[0] ** step) * m32 / denom
        param, m, v = p32.to(param.dtype), m32.to(moment_dtype), v32.to(moment_dtype)
    return param, m, v


@pytest.mark.parametrize("fp32_moments", [True, False])
@pytest.mark.parametrize("fused, chunk", [(True, 1 << 20), (True, 37), (False, 50)])
def test_cpu_adam_steps_bf16_weights_with_bf16_or_fp32_moments(fp32_moments, fused, chunk):
    g = torch.Generator().manual_seed(0)
    start = torch.randn(300, generator=g).to(torch.bfloat16)
    grads = [torch.randn(300, generator=g).to(torch.bfloat16) for _ in range(5)]
    param = torch.nn.Parameter(start.clone())
    optimizer = CPUAdam([param], lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, use_fused=fused,
                        chunk_elements=chunk, fp32_optimizer_states=fp32_moments)
    for grad in grads:
        param.grad = grad.clone()
        optimizer.step()
    want, want_m, want_v = _bf16_reference(start, grads, fp32_moments)
    state = optimizer.state[param]
    assert param.dtype == torch.bfloat16
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == (torch.float32 if fp32_moments else torch.bfloat16)
    one_ulp = 2 * torch.finfo(torch.bfloat16).eps   # the kernels' fp32 sums may round the other way
    assert ((param.detach().float() - want.float()).abs() <= one_ulp * want.float().abs().clamp(min=1e-3)).all()
    assert torch.allclose(state["exp_avg"].float(), want_m.float(), rtol=one_ulp, atol=1e-6)


def test_deepspeed_cpu_adams_fp32_optimizer_states_is_honoured():
    param = torch.nn.Parameter(torch.ones(8, dtype=torch.bfloat16))
    param.grad = torch.ones(8, dtype=torch.bfloat16)
    for fp32, dtype in ((True, torch.float32), (False, torch.bfloat16)):
        optimizer = DeepSpeedCPUAdam([param], lr=0.01, fp32_optimizer_states=fp32)
        optimizer.step()
        assert optimizer.state[param]["exp_avg"].dtype == dtype


def test_cpu_adam_still_refuses_what_it_cannot_step():
    with pytest.raises(ValueError, match="CPUAdam updates fp32 or bf16 tensors"):
        param = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
        param.grad = torch.ones(4, dtype=torch.float16)
        CPUAdam([param]).step()


def test_the_cpu_adams_own_state_dict_keeps_fp32_moments_of_bf16_weights():
    param = torch.nn.Parameter(torch.ones(8, dtype=torch.bfloat16))
    param.grad = torch.full((8,), 1e-3, dtype=torch.bfloat16)
    optimizer = CPUAdam([param], lr=0.01)
    optimizer.step()
    saved = optimizer.state_dict()
    other = CPUAdam([param], lr=0.01)
    other.load_state_dict(saved)
    assert other.state[param]["exp_avg_sq"].dtype == torch.float32   # torch would cast it to bf16
    assert torch.equal(other.state[param]["exp_avg_sq"], optimizer.state[param]["exp_avg_sq"])
