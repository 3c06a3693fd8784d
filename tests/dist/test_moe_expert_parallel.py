"""Expert parallelism on gloo through the real launcher: the MoE layer at ep 2 equals ep 1.

ep 2 on 2 ranks (one expert group), and ep 2 x data 2 on 4 ranks (two expert groups, expert-data
groups [0,2] and [1,3]). Each rank routes its own tokens (uneven counts in the no-drop cases, whose
capacity the expert group agrees on) with its own draws. Outputs, l_aux, exp_counts and (to 1e-6
relative) input and gate gradients must equal ep 1's on the same rank; an expert's gradient must equal the ep 1
gradients of that expert summed over the expert group, and reduced over the expert-data group the
world's sum. The weights after several engine steps are the next phase (engine integration).
"""
from pathlib import Path

import pytest

from tests.helpers.world import check, run_world

WORKER = Path(__file__).parent / "workers" / "moe_ep_worker.py"
CASES = 6


@pytest.mark.parametrize("world_size, expert_groups", [(2, [[0, 1]]), (4, [[0, 1], [2, 3]])])
def test_ep_2_equals_ep_1(world_size, expert_groups):
    results = check(run_world(WORKER, world_size, "2", timeout=300))
    worst = {}
    for result in results:
        records = result.records()
        assert len(records) == CASES, result.stdout
        for record in records:
            assert record["expert_ranks"] in expert_groups and result.rank in record["expert_ranks"]
            assert record["expert_data_ranks"] == list(range(result.rank % 2, world_size, 2))
            assert record["same_counts"], record
            for key in ("output", "l_aux", "input_grad", "gate_grad", "expert_grad", "expert_grad_reduced"):
                assert record[key] < 1e-6, (key, record)
                worst[key] = max(worst.get(key, 0.0), record[key])
    dropping = [r for result in results for r in result.records() if r["case"] == "top1 RSample, drops"]
    assert all(r["tokens_all_dropped"] > 0 for r in dropping)        # capacity really bit
    print(f"ep 2 on {world_size} ranks vs ep 1, max differences (abs: output, l_aux; relative: grads):", {k: f"{v:.1e}" for k, v in worst.items()})
