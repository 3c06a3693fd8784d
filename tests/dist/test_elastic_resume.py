"""Resume at another world size: a 4-rank run checkpoints, stops, and 2 ranks continue it with the
same global batch (accumulation 2 -> 4), the same samples, the same losses and weights as an
unbroken run and as a single-process AdamW fed the same global batches (fp32, 1e-5)."""
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
