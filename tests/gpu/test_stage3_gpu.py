"""ZeRO-3 and offload on CUDA (NCCL): parity with torch.optim.AdamW on the same GPU, pinned host masters.

One rank per visible GPU (at most 2). Skipped without CUDA.
"""
import json
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.gpu


def main():
    import torch
    from tests.helpers import stage3_model as s3
    from launcher import zero
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    for offload_optimizer, offload_param in ((False, False), (True, False), (True, True)):
        model = s3.make_model()
        cfg = s3.config(2, 0.05, 64)
        if offload_optimizer:
            cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if offload_param:
            cfg["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
        engine, opt, _, _ = zero.initialize(model=model, model_parameters=s3.groups(model), config=cfg)
        x, y = s3.data(world_size, 2, s3.STEPS)
        x, y = x.to(device), y.to(device)
        for step in range(s3.STEPS):
            for micro in range(2):
                start = ((step * 2 + micro) * world_size + rank) * s3.MBS
                loss = torch.nn.functional.mse_loss(engine(x[start:start + s3.MBS]), y[start:start + s3.MBS])
                engine.backward(loss)
                engine.step()
        ref = s3.reference(world_size, 2, 0.05, s3.STEPS)     # on the CPU: fp32 without TF32
        full = s3.full_params(engine)
        error = max((full[n].cpu() - p).abs().max().item() for n, p in ref.named_parameters())
        masters = [m for g in opt.param_groups for m in g["params"]]
        print("RESULT " + json.dumps({
            "offload_optimizer": offload_optimizer, "offload_param": offload_param, "max_abs_error": error,
            "masters_on": sorted({m.device.type for m in masters}),
            "pinned": all(m.is_pinned() for m in masters) if offload_optimizer else None,
            "shards_on": sorted({p.ds_tensor.device.type for p in model.parameters() if hasattr(p, "ds_tensor")})}),
            flush=True)


@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs CUDA")
def test_stage3_and_offload_on_cuda():
    import torch
    from tests.helpers.world import check, run_world
    world_size = min(2, torch.cuda.device_count())
    results = check(run_world(__file__, world_size, timeout=300))
    for result in results:
        records = result.records()
        assert len(records) == 3
        plain, optim, both = records
        for r in records:
            assert r["max_abs_error"] < 1e-5, r
        assert plain["masters_on"] == ["cuda"] and plain["shards_on"] == ["cuda"]
        assert optim["masters_on"] == ["cpu"] and optim["pinned"] and optim["shards_on"] == ["cuda"]
        assert both["masters_on"] == ["cpu"] and both["shards_on"] == ["cpu"]


if __name__ == "__main__":
    main()
