"""ZeRO-Infinity's parameter NVMe offload on 2 gloo ranks (stage 3): the same losses as
``offload_param.device: cpu`` (fp32 and bf16, with the optimizer states on the host or on NVMe too),
the shards in a file (not in host memory), checkpoints both ways between the two, and the errors.

Runs this file as a script (tests/helpers/world.py); NVME_ROOT names a fresh folder per run.
"""
import errno
import json
import os
import shutil

from tests.helpers import stage3_model as s3  # noqa: E402

STEPS = 5
SHARD = 2048   # the largest shard on a rank (the 64x64 weight over 2 ranks)


def build(param, folder=None, bf16=False, optimizer="cpu", count=3, size=SHARD):
    from launcher import zero
    # a prefetch bucket of one element: each module's gather starts one module ahead, so the read
    # ahead (the module after that) runs
    cfg = s3.config(2, 0.05, 64, stage3_prefetch_bucket_size=1)
    offload = {"device": param, "pin_memory": True}
    if param == "nvme":
        offload.update(nvme_path=folder, buffer_count=count, buffer_size=size)
    cfg["zero_optimization"]["offload_param"] = offload
    if optimizer == "nvme":
        states = os.path.join(folder or os.environ["NVME_ROOT"], "states")
        os.makedirs(states, exist_ok=True)
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": states,
                                                         "buffer_count": 2, "buffer_size": 900}
    elif optimizer:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": optimizer}
    if bf16:
        cfg["bf16"] = {"enabled": True}
    model = s3.make_model()
    engine, _, _, _ = zero.initialize(model=model, model_parameters=s3.groups(model), config=cfg)
    return engine


def train(engine, rank, world_size, first, last):
    return s3.losses(engine, rank, world_size, first, last, STEPS)


def parity(rank, world_size, root, bf16, optimizer):
    name = f"{'bf16' if bf16 else 'fp32'}-{optimizer}"
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    host = train(build("cpu", bf16=bf16, optimizer=optimizer, folder=folder), rank, world_size, 0, STEPS)
    engine = build("nvme", folder, bf16=bf16, optimizer=optimizer)
    nvme = train(engine, rank, world_size, 0, STEPS)
    files = engine.strategy.param_files
    path = os.path.join(folder, f"dslaunch-rank{rank}", "params.shards")
    shards = [p.ds_tensor for p in engine.module.parameters() if hasattr(p, "ds_state")]
    return {"case": "parity", "name": name, "host": host, "nvme": nvme, "file_bytes": os.path.getsize(path),
            "disk_bytes": files.disk_bytes, "reads": files.reads, "reads_ahead": files.reads_ahead,
            "shard_storage": [t.untyped_storage().nbytes() for t in shards], "memory": engine.memory_breakdown()}


def checkpoints(rank, world_size, root):
    """nvme -> cpu and cpu -> nvme through a checkpoint at step 2; then the folder removed mid-run
    fails by name and the checkpoint saved before still loads."""
    import torch.distributed as dist
    folder = lambda name: os.makedirs(os.path.join(root, name), exist_ok=True) or os.path.join(root, name)  # noqa: E731
    ckpt = os.path.join(root, "ckpt")
    engine = build("nvme", folder("save"))
    first = train(engine, rank, world_size, 0, 2)
    engine.save_checkpoint(ckpt, tag="nvme2")
    rest = train(engine, rank, world_size, 2, STEPS)
    shutil.rmtree(os.path.join(root, "save", f"dslaunch-rank{rank}"))
    removed = s3.nvme_error(train, engine, rank, world_size, 2, 3)
    dist.barrier()
    engine = build("cpu")
    first_cpu = train(engine, rank, world_size, 0, 2)
    engine.save_checkpoint(ckpt, tag="cpu2")
    out = {"case": "checkpoint", "first": first, "first_cpu": first_cpu, "rest": rest, "removed": removed,
           "folder": os.path.join(root, "save", f"dslaunch-rank{rank}")}
    for key, param, tag in (("nvme_to_cpu", "cpu", "nvme2"), ("cpu_to_nvme", "nvme", "cpu2"),
                            ("nvme_to_nvme", "nvme", "nvme2")):
        engine = build(param, folder(key))
        engine.load_checkpoint(ckpt, tag=tag)
        out[key] = train(engine, rank, world_size, 2, STEPS)
    return out


def full_disk(rank, world_size, root):
    """An injected ENOSPC from the writer: the shards are written back on the I/O thread, so the failure
    is raised by the next step's first gather, on every rank at the same place, by name."""
    from launcher.zero.stages.stage3 import nvme_params
    os.makedirs(os.path.join(root, "full"), exist_ok=True)
    engine = build("nvme", os.path.join(root, "full"))
    train(engine, rank, world_size, 0, 1)
    engine.strategy.param_files.flush()   # the first step's writes are on disk before the disk "fills"

    def no_space(*_):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    real, nvme_params._pwrite_all = nvme_params._pwrite_all, no_space
    try:
        error = s3.nvme_error(train, engine, rank, world_size, 1, 3)
    finally:
        nvme_params._pwrite_all = real
    return {"case": "full", "error": error, "path": engine.strategy.param_files.path}


def start_errors(rank, world_size, root):
    from launcher.zero.errors import ConfigError
    os.makedirs(os.path.join(root, "ok"), exist_ok=True)
    out = {"case": "start"}
    for name, kwargs in (("missing", {"folder": os.path.join(root, "no-such-folder")}),
                         ("unwritable", {"folder": "/proc"}),
                         ("small", {"folder": os.path.join(root, "ok"), "size": SHARD - 1})):
        out[name] = s3.raised(ConfigError, build, "nvme", **kwargs)
    return out


def main():
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    root = os.environ["NVME_ROOT"]
    records = [parity(rank, world_size, root, bf16, optimizer)
               for bf16, optimizer in ((False, "cpu"), (True, "cpu"), (False, "nvme"), (True, "nvme"), (False, None))]
    records += [checkpoints(rank, world_size, root), full_disk(rank, world_size, root),
                start_errors(rank, world_size, root)]
    for record in records:
        print("RESULT " + json.dumps(record), flush=True)


def test_param_nvme_offload_matches_cpu_offload_and_fails_by_name(tmp_path):
    from tests.helpers.world import check, run_world
    results = check(run_world(__file__, 2, timeout=400, env={"NVME_ROOT": str(tmp_path)}))
    for result in results:
        *parities, ckpt, full, start = result.records()
        assert [r["name"] for r in parities] == ["fp32-cpu", "bf16-cpu", "fp32-nvme", "bf16-nvme", "fp32-None"]
        for r in parities:
            assert r["nvme"] == r["host"], r                      # bitwise: the same arithmetic
            assert r["file_bytes"] == r["disk_bytes"] > 0, r      # the shards are in the file
            assert all(n <= 4 for n in r["shard_storage"]), r     # and only placeholders in memory
            assert r["memory"]["nvme_param_buffers"] == 3 * SHARD * (2 if r["name"].startswith("bf16") else 4), r
            assert 0 < r["reads_ahead"] < r["reads"], r           # the read ahead ran, and was used
        assert ckpt["first"] == ckpt["first_cpu"], ckpt
        for key in ("nvme_to_cpu", "cpu_to_nvme", "nvme_to_nvme"):
            assert ckpt[key] == ckpt["rest"], (key, ckpt)
        assert ckpt["removed"] and ckpt["removed"].startswith("NvmeOffloadError") and ckpt["folder"] in ckpt["removed"]
        assert full["error"] and full["error"].startswith("NvmeOffloadError") and full["path"] in full["error"], full
        assert "No space left" in full["error"], full
        for name, words in (("missing", ("no-such-folder", "offload_param.nvme_path")),
                            ("unwritable", ("/proc", "offload_param.nvme_path")),
                            ("small", ("offload_param.buffer_size", str(SHARD)))):
            assert start[name] and all(w in start[name] for w in words) and "hint" in start[name], (name, start)
    out = "".join(r.stdout for r in results)
    assert "NVMe offload: parameters" in out and "bytes on disk per parameter" in out


if __name__ == "__main__":
    main()
