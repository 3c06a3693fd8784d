"""ZeRO-Infinity's optimizer-state NVMe offload on 2 gloo ranks (stage 3): the same losses as host
offload, the states in files (not in host memory), checkpoints through them, and the errors.

Runs this file as a script (tests/helpers/world.py); NVME_ROOT names a fresh folder per run.
"""
import json
import os
import shutil

from tests.helpers import stage3_model as s3  # noqa: E402

STEPS = 6


def build(device, folder=None, bf16=False, chunk=300, count=2, states=False):
    from launcher import zero
    cfg = s3.config(2, 0.05, 64)
    offload = {"device": device, "pin_memory": True}
    if device == "nvme":
        # a chunk of 300 elements: several chunks per rank, so the read-ahead and write-behind run
        offload.update(nvme_path=folder, buffer_count=count, buffer_size=chunk * 3)
        cfg["aio"] = {"block_size": 1048576, "queue_depth": 8}
    cfg["zero_optimization"]["offload_optimizer"] = offload
    if bf16:
        cfg["bf16"] = {"enabled": True}
    if states:   # DeepSpeed's bf16 masters, gradients and Adam moments (issue 43 item 3): bf16 files
        cfg["bf16"] = {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    model = s3.make_model()
    engine, opt, _, _ = zero.initialize(model=model, model_parameters=s3.groups(model), config=cfg)
    return engine, opt


def train(engine, rank, world_size, first, last):
    return s3.losses(engine, rank, world_size, first, last, STEPS)


def parity(rank, world_size, root, bf16, states=False):
    """Host offload against NVMe offload: losses, and the files hold the host run's states."""
    engine, opt = build("cpu", bf16=bf16, states=states)
    host = train(engine, rank, world_size, 0, STEPS)
    host_states = [dict(opt.state[m]) for g in opt.param_groups for m in g["params"]]
    folder = os.path.join(root, "bf16states" if states else "bf16" if bf16 else "fp32")
    os.makedirs(folder, exist_ok=True)
    engine, opt = build("nvme", folder, bf16=bf16, states=states)
    nvme = train(engine, rank, world_size, 0, STEPS)
    files_equal = []
    import torch
    for position, state in enumerate(host_states):
        for kind in ("exp_avg", "exp_avg_sq"):
            path = os.path.join(folder, f"dslaunch-rank{rank}", f"group{position}.{kind}")
            on_disk = torch.from_file(path, size=state[kind].numel(), dtype=state[kind].dtype)
            files_equal.append(bool(torch.equal(on_disk, state[kind].view(-1))))
    resident = [t for st in opt.state.values() for t in st.values() if torch.is_tensor(t) and t.dim() > 0]
    masters = [m for g in opt.param_groups for m in g["params"]]
    return {"case": "parity", "bf16": bf16, "states": states, "moment_dtypes": sorted({str(st[k].dtype) for st in
            host_states for k in ("exp_avg", "exp_avg_sq")}), "host": host, "nvme": nvme, "files_equal": files_equal,
            "resident_states": len(resident), "master_storage": [m.untyped_storage().nbytes() for m in masters],
            "memory": engine.memory_breakdown()}


def checkpoint_and_removal(rank, world_size, root):
    """Save at step 3 and go on; then a run whose folder goes away fails by name, and a fresh engine
    resumes from the checkpoint with the same losses as the uninterrupted run."""
    import torch.distributed as dist
    ckpt = os.path.join(root, "ckpt")
    for name in ("a", "b", "c"):
        os.makedirs(os.path.join(root, name), exist_ok=True)
    engine, _ = build("nvme", os.path.join(root, "a"))
    engine.save_checkpoint(ckpt, tag="s0")        # before any step: the CPU Adam has no state yet
    first = train(engine, rank, world_size, 0, 3)
    engine.save_checkpoint(ckpt, tag="s3")
    rest = train(engine, rank, world_size, 3, STEPS)
    shutil.rmtree(os.path.join(root, "a", f"dslaunch-rank{rank}"))
    error = s3.nvme_error(train, engine, rank, world_size, 3, 4)
    dist.barrier()
    engine, _ = build("nvme", os.path.join(root, "b"))
    engine.load_checkpoint(ckpt, tag="s3")
    resumed = train(engine, rank, world_size, 3, STEPS)
    engine, _ = build("nvme", os.path.join(root, "c"))
    engine.load_checkpoint(ckpt, tag="s0")
    from_start = train(engine, rank, world_size, 0, 3)
    return {"case": "checkpoint", "first": first, "rest": rest, "resumed": resumed, "error": error,
            "from_start": from_start,
            "folder": os.path.join(root, "a", f"dslaunch-rank{rank}")}


def full_disk(rank, world_size, roomy, host):
    """The disk fills mid-run: the states' space was taken at start, so training goes on unchanged."""
    import torch.distributed as dist
    engine, _ = build("nvme", roomy)
    losses = train(engine, rank, world_size, 0, 3)
    filled = 0
    fd = os.open(os.path.join(roomy, f"filler-rank{rank}"), os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            filled += os.write(fd, b"\0" * 4096)
    except OSError:   # no space left on the device
        pass
    finally:
        os.close(fd)
    dist.barrier()
    losses += train(engine, rank, world_size, 3, STEPS)
    return {"case": "full", "equal": losses == host, "filled": filled}


def start_errors(rank, world_size, root, small):
    from launcher.zero.errors import ConfigError
    out = {"case": "start"}
    for name, path in (("missing", os.path.join(root, "no-such-folder")), ("small", small)):
        if path is None:
            continue
        out[name] = s3.raised(ConfigError, build, "nvme", path)
    return out


def main():
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    root = os.environ["NVME_ROOT"]
    fp32 = parity(rank, world_size, root, False)
    for record in (fp32, parity(rank, world_size, root, True), parity(rank, world_size, root, True, states=True),
                   checkpoint_and_removal(rank, world_size, root),
                   start_errors(rank, world_size, root, os.environ.get("NVME_SMALL") or None)):
        print("RESULT " + json.dumps(record), flush=True)
    if os.environ.get("NVME_ROOMY"):
        print("RESULT " + json.dumps(full_disk(rank, world_size, os.environ["NVME_ROOMY"], fp32["host"])), flush=True)


def _tmpfs(tmp_path, name, size):
    """A tmpfs of ``size`` (root only); None where it cannot be mounted."""
    import subprocess
    folder = tmp_path / name
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    return str(folder) if done.returncode == 0 else None


def test_nvme_offload_matches_host_offload_and_fails_by_name(tmp_path):
    import subprocess
    from tests.helpers.world import check, run_world
    small = _tmpfs(tmp_path, "small", "16k")    # a rank's states here: 30 KB
    roomy = _tmpfs(tmp_path, "roomy", "1m")
    try:
        results = check(run_world(__file__, 2, timeout=300, env={
            "NVME_ROOT": str(tmp_path), "NVME_SMALL": small or "", "NVME_ROOMY": roomy or ""}))
    finally:
        for mounted in (small, roomy):
            if mounted:
                subprocess.run(["umount", mounted])
    for result in results:
        fp32, bf16, states, ckpt, start, *full = result.records()
        assert states["moment_dtypes"] == ["torch.bfloat16"], states   # the bf16 keys took effect
        if roomy:   # training went on, after the fillers took every free byte (one rank fills it)
            assert full[0]["equal"], full
        for r in (fp32, bf16, states):
            assert r["nvme"] == r["host"], r            # the same arithmetic, chunk by chunk
            assert r["files_equal"] and all(r["files_equal"]), r
            assert r["resident_states"] == 0, r          # no moment stays in host memory
            assert all(n <= 4 for n in r["master_storage"]), r   # the masters are placeholders
            assert 0 < r["memory"]["nvme_buffers"] <= 2 * 300 * 12, r
        assert ckpt["resumed"] == ckpt["rest"], ckpt
        assert ckpt["from_start"] == ckpt["first"], ckpt
        assert ckpt["error"] and ckpt["error"].startswith("NvmeOffloadError") and ckpt["folder"] in ckpt["error"]
        assert "no-such-folder" in start["missing"] and "hint" in start["missing"], start
        if small:
            assert small in start["small"], start
    if roomy:
        assert sum(result.records()[5]["filled"] for result in results) > 0
    assert "NVMe offload: optimizer states" in results[0].stdout or "NVMe offload: optimizer states" in \
        "".join(r.stdout for r in results)


if __name__ == "__main__":
    main()
