"""DeepSpeed's gradient tensor-fragment functions (``deepspeed.utils.safe_get_full_grad`` ...) on 2
gloo ranks at ZeRO 0-3: after backward and before ``step``, a parameter's full gradient equals the
one computed without ZeRO (one process, the mean of both ranks' losses); a write reaches the step.
"""
import json
import os

STAGES, MBS, WIDTH = (0, 1, 2, 3), 4, 6


def make_model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3))


def batch(rank):
    import torch
    g = torch.Generator().manual_seed(7 + rank)
    return torch.randn(MBS, WIDTH, generator=g), torch.randn(MBS, 3, generator=g)


def loss_of(model, rank):
    import torch
    x, y = batch(rank)
    return torch.nn.functional.mse_loss(model(x), y)


def reference_grads(world_size):
    import torch
    model = make_model()
    torch.stack([loss_of(model, rank) for rank in range(world_size)]).mean().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def check_stage(stage, rank, world_size, expected):
    import torch
    from launcher import zero
    from launcher.zero.utils import (safe_get_full_fp32_param, safe_get_full_grad, safe_get_local_grad,
                                     safe_set_full_grad, safe_update_full_grad_vectorized)

    model = make_model()
    engine, _, _, _ = zero.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": MBS,
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.1, "weight_decay": 0.0}}})
    engine.backward(loss_of(engine, rank))
    params = dict(model.named_parameters())
    record = {"stage": stage, "grad_gap": max((safe_get_full_grad(p).cpu() - expected[n]).abs().max().item()
                                              for n, p in params.items())}
    if stage == 3:   # the local parts, rank after rank, make the flattened full gradient
        weight = params["0.weight"]
        local = safe_get_local_grad(weight).reshape(-1)
        parts = [torch.zeros(weight.ds_numel) for _ in range(world_size)]
        padded = torch.zeros(weight.ds_numel)
        padded[:local.numel()] = local
        torch.distributed.all_gather(parts, padded)
        sizes = [torch.zeros(1) for _ in range(world_size)]
        torch.distributed.all_gather(sizes, torch.tensor([float(local.numel())]))
        joined = torch.cat([part[:int(size.item())] for part, size in zip(parts, sizes)])
        record["local_gap"] = (joined - expected["0.weight"].reshape(-1)).abs().max().item()
    # doubled through the vectorized update, then the first layer's bias zeroed: Adam's first step
    # then leaves that bias where it was
    safe_update_full_grad_vectorized(list(params.values()), lambda grad, param: grad * 2)
    record["doubled_gap"] = max((safe_get_full_grad(p).cpu() - 2 * expected[n]).abs().max().item()
                                for n, p in params.items())
    bias = params["0.bias"]
    before = safe_get_full_fp32_param(bias).clone()
    safe_set_full_grad(bias, torch.zeros_like(expected["0.bias"]))
    engine.step()
    record["zeroed_bias_moved"] = (safe_get_full_fp32_param(bias) - before).abs().max().item()
    record["other_moved"] = (safe_get_full_fp32_param(params["2.bias"]).cpu() -
                             make_model()[2].bias.detach()).abs().max().item()
    engine.destroy()
    return record


def main():
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    expected = reference_grads(world_size)
    for stage in STAGES:
        print("RESULT " + json.dumps({"rank": rank, **check_stage(stage, rank, world_size, expected)}), flush=True)


def test_full_gradient_at_each_stage_is_the_one_without_zero_and_a_write_reaches_the_step():
    from tests.helpers.world import check, run_world

    for result in check(run_world(__file__, 2, timeout=180)):
        records = result.records()
        assert [r["stage"] for r in records] == list(STAGES)
        for r in records:
            assert r["grad_gap"] < 1e-6, r
            assert r["doubled_gap"] < 1e-6, r
            assert r["zeroed_bias_moved"] == 0.0, r
            assert r["other_moved"] > 1e-3, r
            if r["stage"] == 3:
                assert r["local_gap"] < 1e-6, r


if __name__ == "__main__":
    main()
