"""Checkpoints that survive a kill and a full disk (issue 33): a kill at any file operation of
save_checkpoint leaves 'latest' on a complete checkpoint that resumes; a full disk is a
CheckpointError naming the folder and the bytes, with the last checkpoint intact."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "dist", "workers", "ckpt_fault_worker.py")


def worker(*args, fault_at=0):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FAULT_AT": str(fault_at), "PYTHONPATH": ROOT}
    for key in ("RANK", "WORLD_SIZE", "DSLAUNCH_DEBUG"):
        env.pop(key, None)
    return subprocess.run([sys.executable, WORKER, *args], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.timeout(1200)   # two fresh processes for each of ~15 fault points: 47 s alone, 300 s at load 15
@pytest.mark.parametrize("second_tag", ["b", "a"])   # a new tag, and the same tag saved again
def test_a_kill_at_any_point_of_save_leaves_latest_on_a_complete_checkpoint(tmp_path, second_tag):
    fault = 0
    while True:
        fault += 1
        ckpt, ref = tmp_path / f"ckpt{fault}", tmp_path / f"ref{fault}"
        ckpt.mkdir()
        ref.mkdir()
        saved = worker(str(ckpt), str(ref), "save", second_tag, fault_at=fault)
        finished = "saved" in saved.stdout
        assert finished or saved.returncode == 137, saved.stderr
        loaded = worker(str(ckpt), str(ref), "load", second_tag)
        assert loaded.returncode == 0 and "resumed" in loaded.stdout, (fault, loaded.stderr)
        line = next(text for text in loaded.stdout.splitlines() if text.startswith("loaded "))
        if second_tag == "b":
            expected = "loaded b ['second']" if (ckpt / "latest").read_text() == "b" else "loaded a ['first']"
            assert line == expected, (fault, line)
        else:
            assert line in ("loaded a ['first']", "loaded a ['second']", "loaded .a.old ['first']"), (fault, line)
        if finished:
            assert line.endswith("['second']")
            break
    assert fault > 5   # the kill met every file operation of the save, then the save ran through


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a small tmpfs needs root and mount")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mount
    if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_a_clear_error_and_the_last_checkpoint_stays(small_disk):
    from launcher import zero
    from launcher.zero.errors import CheckpointError

    torch.manual_seed(0)
    model = torch.nn.Linear(256, 1024)   # 263k parameters: about 4 MiB of checkpoint (weights + Adam)
    engine, _, _, _ = zero.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})
    try:
        engine.backward(engine(torch.ones(2, 256)).pow(2).mean())
        engine.step()
        engine.save_checkpoint(str(small_disk), tag="first")
        saved = torch.cat([p.detach().view(-1).clone() for p in model.parameters()])
        engine.backward(engine(torch.ones(2, 256)).pow(2).mean())
        engine.step()
        with pytest.raises(CheckpointError) as raised:
            engine.save_checkpoint(str(small_disk), tag="second")
        message = str(raised.value)
        assert str(small_disk / ".second.partial") in message
        assert "No space left on device" in message or "the file system is full" in message
        assert "needs about" in message and "bytes are free" in message
        assert (small_disk / "latest").read_text() == "first"
        assert sorted(os.listdir(small_disk)) == ["first", "latest"]   # no partial folder left behind
        engine.load_checkpoint(str(small_disk))
        assert torch.equal(torch.cat([p.detach().view(-1) for p in model.parameters()]), saved)
    finally:
        engine.destroy()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
