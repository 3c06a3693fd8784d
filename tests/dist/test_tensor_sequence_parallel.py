"""Sequence parallelism (tensor 2 x data 2, gloo, the real launcher) against single-process AdamW.

Between the tensor-parallel linears each tensor rank holds half the sequence; the LayerNorms and the
row-parallel bias are replicated but see only that half, so their gradients are summed over the
tensor group. fp32, 4 steps, accumulation 2, clipping active, at ZeRO stages 0-3 over the data axis:
every parameter must match the reference (shards their slice) and the clip norm the reference's
(the replicated gradients, once summed, counted once).
"""
from pathlib import Path

from tests.helpers.world import check, run_world

WORKER = Path(__file__).parent / "workers" / "tp_sequence_worker.py"


def test_sequence_parallel_tensor_2_x_data_2_matches_adamw_at_every_stage():
    results = check(run_world(WORKER, 4, "0,1,2,3", timeout=300))
    for result in results:
        records = result.records()
        assert [r["stage"] for r in records] == [0, 1, 2, 3], result.stdout
        print(f"rank {result.rank} sequence parallel, tensor 2 x data 2, (stage, max abs error, norm error):",
              [(r["stage"], r["max_abs_error"], max(abs(a - b) for a, b in zip(r["norms"], r["reference_norms"])))
               for r in records])
        for record in records:
            assert record["marked"] == ["norm1.bias", "norm1.weight", "norm2.bias", "norm2.weight", "proj.bias"]
            assert record["max_abs_error"] < 1e-5, record
            assert len(record["norms"]) == 4
            for norm, ref_norm in zip(record["norms"], record["reference_norms"]):
                assert abs(norm - ref_norm) < 1e-5 and norm > 0.05, record   # 0.05: the clip
