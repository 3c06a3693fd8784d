"""Offload's host memory on CUDA (issue 32 item 4): page-locked buffers of their exact size, and
stage 3's gradients kept on the device until the CPU Adam takes them (host: master and Adam's
two moments only), training exactly as the step with host gradients does.

Runs this file as one rank (tests/helpers/world.py). Skipped without CUDA.
"""
import json
import os

import pytest

pytestmark = pytest.mark.gpu


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def exact_pinning() -> dict:
    import torch
    from launcher.zero.stages.host_memory import host_zeros

    numel = (300 << 20) // 4 + 3                  # 300 MiB and 12 bytes: rounding would give 512 MiB
    # CUDA's context and the first page-locked registration map their own host memory (over 100 MB
    # with CUDA 13): make them before the measurement, which is of the buffer alone
    host_zeros((64 << 20) // 4, torch.float32, pin=True)
    torch.cuda.synchronize()
    before = rss()
    host = host_zeros(numel, torch.float32, pin=True)
    grown = rss() - before
    zeros_first = bool((host == 0).all())
    values = torch.randn(numel, device="cuda")
    host.copy_(values, non_blocking=True)
    back = torch.empty_like(values)
    back.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    record = {"pinned": host.is_pinned(), "nbytes": host.untyped_storage().nbytes(), "want": numel * 4,
              "rss_grown": grown, "round_trip": bool(torch.equal(back, values)),
              "zeros_first": zeros_first}
    view = host[5:10]
    del host
    record["freed_with_last_view"] = rss() - before > 250 << 20   # the view keeps the pages
    del view
    record["rss_after_free"] = rss() - before
    return record


def stage3_steps(overlap: bool) -> dict:
    import torch
    from launcher import zero
    from tests.helpers.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_embd=256, n_head=4, seq_len=64, vocab_size=1024)).cuda()
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0, "bf16": {"enabled": True},
              "steps_per_print": 10**9, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True,
                                                                     "overlap_step": overlap}}}
    engine, optimizer, _, _ = zero.initialize(model=model, config=config)
    gen = torch.Generator(device="cuda").manual_seed(1)
    losses = []
    for _ in range(4):
        tokens = torch.randint(0, 1024, (4, 65), device="cuda", generator=gen)
        loss = engine(tokens[:, :-1], tokens[:, 1:])
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    engine.wait_for_step()
    masters = [m for g in optimizer.param_groups for m in g["params"]]
    sizes = {m.numel() for m in masters}
    import gc
    big_host = sum(1 for t in gc.get_objects() if isinstance(t, torch.Tensor) and t.device.type == "cpu"
                   and t.numel() in sizes and t.untyped_storage().nbytes() >= t.numel() * 4)
    record = {"losses": losses, "device_grads": engine.strategy.device_grads,
              "grads_on": sorted({g.device.type for g in engine.strategy.grads}),
              "host_tensors_of_master_size": big_host, "groups": len(masters)}
    engine.destroy()
    return record


def main():
    print("RESULT " + json.dumps({"exact": exact_pinning()}), flush=True)
    print("RESULT " + json.dumps({"device": stage3_steps(False), "host": stage3_steps(True)}), flush=True)


@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs CUDA")
def test_exact_pinning_and_device_gradients_on_cuda():
    from tests.helpers.world import check, run_world

    (result,) = check(run_world(__file__, 1, timeout=300))
    exact, steps = result.records()
    exact = exact["exact"]
    assert exact["pinned"] and exact["nbytes"] == exact["want"] and exact["round_trip"], exact
    assert exact["zeros_first"], exact
    assert exact["rss_grown"] < exact["want"] + (64 << 20), exact          # not 512 MiB
    assert exact["freed_with_last_view"] and exact["rss_after_free"] < 64 << 20, exact
    device, host = steps["device"], steps["host"]
    assert device["device_grads"] and device["grads_on"] == ["cuda"], device
    assert not host["device_grads"] and host["grads_on"] == ["cpu"], host
    # the master and Adam's two moments per group, no host gradient buffer
    assert device["host_tensors_of_master_size"] == 3 * device["groups"], device
    assert host["host_tensors_of_master_size"] > 3 * host["groups"], host
    # the same arithmetic; the norm is summed in another order (last-bit differences of the clip factor)
    assert device["losses"] == pytest.approx(host["losses"], rel=1e-3), (device, host)


if __name__ == "__main__":
    main()
