"""Tensor parallelism (tensor 2 x data 2, gloo, the real launcher) against single-process AdamW.

A vocabulary-parallel embedding, a column- then row-parallel MLP and a column-parallel head with
the fused vocabulary-parallel cross-entropy, split by a four-line plan and trained through
``zero.initialize(mpu=grid)`` at ZeRO stages 0-3 over the data axis: fp32, 4 steps, accumulation
2, clipping active. Every shard must equal its slice of the reference, and the clip norm the
reference's (sharded parameters summed over the tensor group, replicated ones counted once).
"""
from pathlib import Path

from tests.helpers.world import check, run_world

WORKER = Path(__file__).parent / "workers" / "tp_worker.py"


def test_tensor_2_x_data_2_matches_adamw_at_every_stage():
    results = check(run_world(WORKER, 4, "0,1,2,3", timeout=300))
    for result in results:
        records = result.records()
        assert [r["stage"] for r in records] == [0, 1, 2, 3], result.stdout
        for record in records:
            assert record["max_abs_error"] < 1e-5, record
            for norm, ref_norm in zip(record["norms"], record["reference_norms"]):
                assert abs(norm - ref_norm) < 1e-5 and norm > 0.05, record   # 0.05: the clip
            # the shards: 16x8/2 embedding + (8x16+16)/2 fc + 16x8/2 proj + 8 proj bias + 8x16/2 head
            assert record["local_params"] == 64 + 72 + 64 + 8 + 64, record
            assert record["checkpoint_refused"], record   # not yet: a clear error, never clobbered files
