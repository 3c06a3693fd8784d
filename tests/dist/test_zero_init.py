"""zero.Init on 2 gloo ranks: a model built partitioned never occupies its full size on a rank.

Bytes are counted by the kernel, not by us: each rank resets its peak resident set size
(/proc/self/clear_refs), builds the model, and reads the new peak (VmHWM). glibc is told to
serve every allocation above 64 KiB with mmap so that freed layers leave the resident set at
once. The same model built without Init is the control that shows the counter can fail.
"""
import json
from pathlib import Path

import pytest

LAYERS, WIDTH = 16, 1024


def status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def peak_while(build):
    """(result, peak resident bytes above the resident size at the start)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    start = status("VmRSS")
    result = build()
    return result, status("VmHWM") - start


def make_model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def main():
    import torch
    import torch.distributed as dist
    from launcher import zero
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    full_bytes = LAYERS * (WIDTH * WIDTH + WIDTH) * 4

    def build_partitioned():
        with zero.Init():
            return make_model()
    model, init_peak = peak_while(build_partitioned)
    shard_bytes = sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in model.parameters())
    plain, plain_peak = peak_while(make_model)
    # same values as a normally built model (checked on a few layers to stay fast)
    same = True
    for index in (0, LAYERS - 1):
        params = list(model[index].parameters())
        with zero.GatheredParameters(params):
            same &= all(torch.equal(a, b) for a, b in zip(params, plain[index].parameters()))
    print("RESULT " + json.dumps({"rank": rank, "world_size": world_size, "full_bytes": full_bytes,
                                  "init_peak": init_peak, "plain_peak": plain_peak, "shard_bytes": shard_bytes,
                                  "released": all(p.numel() == 0 for p in model.parameters()),
                                  "same_values": bool(same)}), flush=True)

    # the Init-built model trains at stage 3 like the plain one (parity with single-process AdamW)
    from tests.helpers import stage3_model as s3
    with zero.Init():
        small = s3.make_model()
    engine, _, _, _ = zero.initialize(model=small, model_parameters=s3.groups(small), config=s3.config(2, 0.05, 64))
    s3.train(engine, rank, world_size, 2)
    error = s3.max_error(engine, s3.reference(world_size, 2, 0.05, s3.STEPS))
    print("RESULT " + json.dumps({"rank": rank, "parity_error": error}), flush=True)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc peak-RSS reset")
def test_model_built_under_init_never_holds_its_full_size():
    from tests.helpers.world import check, run_world
    results = check(run_world(__file__, 2, timeout=240, env={"MALLOC_MMAP_THRESHOLD_": "65536"}))
    for result in results:
        built, trained = result.records()
        full = built["full_bytes"]
        assert built["released"] and built["same_values"], built
        assert built["shard_bytes"] == full // 2, built
        # control: without Init the whole model is resident, so the counter sees it
        assert built["plain_peak"] > 0.9 * full, built
        # with Init: half the model (this rank's shards) plus a layer or two under construction;
        # RSS also carries allocator slack (seen up to ~4.3 layers in CI), so allow 6 layers: still
        # below the plain build (> 0.9 of the full model). No second bound tuned to a figure CI once
        # saw: the layers are the unit of what Init may hold, and the control shows the counter works
        assert built["init_peak"] < 0.5 * full + 6 * (WIDTH * WIDTH * 4), built
        assert trained["parity_error"] < 1e-5, trained


if __name__ == "__main__":
    main()
