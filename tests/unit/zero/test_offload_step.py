"""The ZeRO-Offload step of stages 1-2 in bf16 (one rank, gloo): what the device does and what
the host does. The norm is measured on the device gradients, unscaling and the cast happen
before the one copy to the host, and the CPU Adam writes the 16-bit weights that go back."""
import pytest
import torch

from launcher import zero
from tests.helpers.tiny import bf16_square_loss_steps


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def train(stage, offload, steps=3, clip=0.05):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    zero_cfg = {"stage": stage}
    if offload:
        zero_cfg["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    config = {"train_micro_batch_size_per_gpu": 8, "gradient_clipping": clip, "bf16": {"enabled": True},
              "zero_optimization": zero_cfg,
              "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}}
    engine, *_ = zero.initialize(model=model, config=config)
    norms = bf16_square_loss_steps(engine, steps)
    weights = [p.detach().clone() for p in model.parameters()]
    return engine, engine.basic_optimizer, weights, norms   # the CPU Adam the ZeRO optimizer steps


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_bf16_offload_trains_like_no_offload(stage):
    _, _, expected, expected_norms = train(stage, offload=False)
    torch.distributed.destroy_process_group()
    engine, optimizer, weights, norms = train(stage, offload=True)
    assert type(optimizer).__name__ == "CPUAdam"
    assert norms == pytest.approx(expected_norms, rel=1e-5)
    for got, want in zip(weights, expected):
        assert got.dtype == torch.bfloat16
        # both round the same fp32 masters to bf16; the two Adam kernels may differ in the last fp32 bit
        assert (got.float() - want.float()).abs().max().item() <= 2 * torch.finfo(torch.bfloat16).eps


def test_updated_masters_go_back_chunk_by_chunk_while_the_step_runs():
    engine, optimizer, _, _ = train(2, offload=True, steps=1)
    placement = engine.strategy.placement
    optimizer.chunk_elements, placement.UPLOAD_NUMEL = 100, 200
    uploads, steps_done = [], []
    real_upload = placement._upload
    placement._upload = lambda position, start, end: (uploads.append((start, end, len(steps_done))),
                                                     real_upload(position, start, end))
    real_step = optimizer.step
    optimizer.step = lambda *a, **k: (real_step(*a, **k), steps_done.append(1))[0]
    x = torch.randn(8, 16).to(torch.bfloat16)
    engine.backward(engine(x).float().pow(2).mean())
    engine.step()
    master = optimizer.param_groups[0]["params"][0]
    during = [u for u in uploads if u[2] == 0]
    assert len(during) >= 3 and during[0][0] == 0, uploads   # several runs, while the step ran
    assert [u[1] for u in uploads][-1] == master.numel()
    weights = torch.cat([p.detach().reshape(-1) for p in engine.module.parameters()])
    assert torch.equal(weights, master.to(torch.bfloat16)[:weights.numel()]), "cast of the masters"


@pytest.mark.parametrize("stage", [1, 2])
def test_grads_reach_the_host_in_backward_and_the_factor_goes_to_the_cpu_adam(stage):
    engine, optimizer, _, _ = train(stage, offload=True, steps=1)
    strategy = engine.strategy
    host = strategy.placement.host_grads[0]
    host.fill_(7.0)
    x = torch.randn(8, 16).to(torch.bfloat16)
    engine.backward(engine(x).float().pow(2).mean())   # a boundary micro-step (no accumulation)
    strategy.prepare_master_grads()
    grads = strategy.norm_grads()
    assert all(g.device == strategy.context.dist_context.device and g.data_ptr() != host.data_ptr() for g in grads)
    covered = strategy.placement.expected[0]
    assert torch.equal(host[:covered], grads[0][:covered].float()), "copied while backward ran"
    before = host.clone()
    strategy.grad_norm_and_overflow()
    strategy.scale_master_grads(0.5)
    assert torch.equal(host, before), "no host pass over the gradients: the CPU Adam applies the factor"
    assert optimizer.grad_factor == 0.5
    optimizer.step()
    assert optimizer.grad_factor == 1.0, "the factor is for one step"
