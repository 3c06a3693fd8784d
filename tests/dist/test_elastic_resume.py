"""Resume at another world size: a 4-rank run checkpoints, stops, and 2 ranks continue it with the
same global batch (accumulation 2 -> 4), the same samples, the same losses and weights as an
unbroken run and as a single-process AdamW fed the same global batches (fp32, 1e-5)."""
import os
from pathlib import Path

import torch

from tests.helpers.world import check, run_world

WORKER = Path(__file__).parent / "workers" / "elastic_worker.py"
LAST = 7


def result(folder, world, stop_at):
    return check(run_world(WORKER, world, str(folder), str(stop_at), str(LAST), timeout=240))[0].records()[0]


def reference(steps):
    """One process, plain torch: each step the mean loss over that step's global batch."""
    import sys
    sys.path.insert(0, str(WORKER.parent))
    import elastic_worker as worker
    data = worker.dataset()
    model = worker.make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    losses = []
    for step in steps:
        ids = torch.tensor(step["ids"])
        loss = torch.nn.functional.mse_loss(model(data.tensors[1][ids]), data.tensors[2][ids])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the engine's default gradient_clipping
        optimizer.step()
        losses.append(loss.item())
    return losses, [p.detach().flatten().tolist() for p in model.parameters()]


def global_batches(count, train_batch_size=8):
    """The samples of steps 1..count at any world size: consecutive train_batch_size runs of
    DistributedSampler's order (seed 0), the order the engine's loader splits over the ranks."""
    from torch.utils.data import DistributedSampler
    order, size = list(DistributedSampler(range(96), num_replicas=1, rank=0)), train_batch_size
    return [{"ids": sorted(order[size * s:size * s + size])} for s in range(count)]


def close(a, b, tol=1e-5):
    return max(abs(x - y) for wa, wb in zip(a, b) for x, y in zip(wa, wb)) < tol


def test_four_ranks_checkpoint_two_ranks_continue_with_the_same_global_batches(tmp_path):
    unbroken = result(tmp_path / "unbroken", 4, LAST + 1)
    first = result(tmp_path / "broken", 4, 5)            # saves after steps 2 and 4, "crashes" after 5
    second = result(tmp_path / "broken", 2, LAST + 1)    # loads step 4, repeats step 5, goes on to 7
    assert [s["step"] for s in unbroken["steps"]] == list(range(1, LAST + 1))
    assert [s["step"] for s in first["steps"]] == [1, 2, 3, 4, 5]
    assert [s["step"] for s in second["steps"]] == [5, 6, 7]
    assert {(s["world"], s["gas"]) for s in second["steps"]} == {(2, 4)}
    assert {(s["world"], s["gas"]) for s in first["steps"]} == {(4, 2)}
    joined = first["steps"][:4] + second["steps"]
    for mine, theirs in zip(joined, unbroken["steps"]):
        assert mine["ids"] == theirs["ids"]                # the next unseen samples, none twice
        assert abs(mine["loss"] - theirs["loss"]) < 1e-5
    seen = [i for s in unbroken["steps"] for i in s["ids"]]
    assert len(seen) == len(set(seen)) == 8 * LAST
    assert close(second["weights"], unbroken["weights"])
    losses, weights = reference(unbroken["steps"])
    assert max(abs(a - s["loss"]) for a, s in zip(losses, unbroken["steps"])) < 1e-5
    assert close(weights, second["weights"])


def test_a_rank_killed_during_a_save_loses_nothing_after_the_restart(tmp_path):
    """2 ranks, saves at steps 2, 4, 6; rank 1 is SIGKILLed inside the save of step 4; dslaunch
    --max_restarts 1 starts the job again, which resumes from step 2 (still 'latest') and finishes."""
    folder = tmp_path / "ckpt"
    ranks = run_world(WORKER, 2, str(folder), str(LAST + 1), str(LAST), "4", timeout=240,
                      launcher_args=("--no_local_rank", "--max_restarts", "1"))
    out, err = ranks[0].stdout, ranks[0].stderr
    assert ranks[0].returncode == 0, err
    restart = [line for line in err.splitlines() if "restart 1/1: rank " in line]
    assert len(restart) == 1, err  # rank 1 killed (SIGKILL), or rank 0 failing on the dead peer first
    resumed_from = [line for line in out.splitlines() if line.startswith("TRY 1 LATEST")]
    assert resumed_from and resumed_from[0].startswith("TRY 1 LATEST global_step2 "), out
    assert "'global_step2'" in resumed_from[0] and "'global_step4'" not in resumed_from[0]
    record = ranks[0].records()[0]
    assert [s["step"] for s in record["steps"]] == [3, 4, 5, 6, 7]   # steps 3 and 4 done again
    assert [s["ids"] for s in record["steps"]] == [b["ids"] for b in global_batches(LAST)[2:]]
    assert (folder / "latest").read_text() == "global_step6"
    assert not [name for name in os.listdir(folder) if name.startswith(".")]
    losses, weights = reference(global_batches(LAST))
    assert max(abs(a - s["loss"]) for a, s in zip(losses[2:], record["steps"])) < 1e-5
    assert close(weights, record["weights"])
