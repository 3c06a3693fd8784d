"""Checkpoint round trips: exact resume on the same world size, resharding 2 -> 3 ranks (and stage
2 -> 1), consolidation to one fp32 state dict, and the dslaunch-zero-to-fp32 command."""
import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.helpers.world import REPO, check, run_world

WORKER = Path(__file__).parent / "workers" / "ckpt_worker.py"


def test_checkpoint_round_trips(tmp_path):
    exact, reshard = tmp_path / "exact", tmp_path / "reshard"
    # world of 2: train with dropout (so the RNG state matters), resume in fresh engines; and a run to reshard
    two = check(run_world(WORKER, 2, f"train:{exact}:2:0.2", f"resume:{exact}:2:0.2", f"train:{reshard}:2:0.0",
                          f"moduleonly:{exact}:1:0.2", timeout=300))[0].records()[0]
    trained, resumed = two["0"], two["1"]
    assert resumed["steps"] == trained["steps"] == 6
    assert resumed["weights"] == trained["weights"]  # bit for bit
    assert resumed["lr"] == trained["lr"]
    assert (exact / "latest").read_text() == "global_step6"
    assert sorted(os.listdir(exact / "mid")) == ["digests.json", "metadata.json", "model_states.pt",
                                                "rank_0_shard.pt", "rank_1_shard.pt"]
    assert not [name for name in os.listdir(exact) if name.startswith(".")]  # no partial folders left
    module_only = two["3"]
    assert module_only["weights"] == trained["mid_weights"]  # loaded into a stage-1 engine
    assert module_only["steps"] == 0 and module_only["optimizer_state"] == 0 and module_only["lr"] == [0.0]

    # world of 3 at stage 1 continues the 2-rank stage-2 checkpoint directly
    three = check(run_world(WORKER, 3, f"resume:{reshard}:1:0.0", timeout=300))[0].records()[0]["0"]
    reference = two["2"]["weights"]
    error = max(abs(a - b) for wa, wb in zip(reference, three["weights"]) for a, b in zip(wa, wb))
    assert error < 1e-5

    from launcher import zero

    state = zero.get_fp32_state_dict_from_zero_checkpoint(reshard)
    assert list(state) == ["0.weight", "0.bias", "3.weight", "3.bias"]
    assert all(t.dtype == torch.float32 for t in state.values())
    assert [t.flatten().tolist() for t in state.values()] == reference

    out = tmp_path / "model.pt"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "launcher.zero.checkpoint.consolidate", str(reshard), str(out)]
    done = subprocess.run(command + ["--tag", "global_step6"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert [t.flatten().tolist() for t in torch.load(out).values()] == reference
    bad = subprocess.run(command + ["--tag", "nope"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "no checkpoint 'nope'" in bad.stderr
    assert "available tags: global_step6, mid" in bad.stderr and "Traceback" not in bad.stderr
    # one checkpoint's folder given directly is its tag, not a "pass --tag" error
    direct = subprocess.run(command[:-2] + [str(reshard / "global_step6"), str(out)], capture_output=True,
                            text=True, env=env)
    assert direct.returncode == 0, direct.stderr
    assert [t.flatten().tolist() for t in torch.load(out).values()] == reference
