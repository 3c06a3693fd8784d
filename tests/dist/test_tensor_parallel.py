"""Tensor parallelism (tensor 2 x data 2, gloo, the real launcher) against single-process AdamW.

A vocabulary-parallel embedding, a column- then row-parallel MLP and a column-parallel head with
the fused vocabulary-parallel cross-entropy, split by a four-line plan and trained through
``zero.initialize(mpu=grid)`` at ZeRO stages 0-3 over the data axis: fp32, 4 steps, accumulation
2, clipping active. Every shard must equal its slice of the reference, and the clip norm the
reference's (sharded parameters summed over the tensor group, replicated ones counted once).
Checkpoints: saved on tensor 2 x data 2 after 2 steps, resumed on tensor 2 x data 1 (accumulation 4,
the same global batch) for steps 3-4, at each stage; ``dslaunch-zero-to-fp32`` joins the shards.
"""
import json
from pathlib import Path

import torch

from tests.helpers.world import check, run_world

WORKER = Path(__file__).parent / "workers" / "tp_worker.py"


def test_tensor_2_x_data_2_matches_adamw_at_every_stage():
    results = check(run_world(WORKER, 4, "0,1,2,3", timeout=300))
    for result in results:
        records = result.records()
        assert [r["stage"] for r in records] == [0, 1, 2, 3], result.stdout
        print("tensor 2 x data 2, (stage, max abs error):", [(r["stage"], r["max_abs_error"]) for r in records])
        for record in records:
            assert record["max_abs_error"] < 1e-5, record
            for norm, ref_norm in zip(record["norms"], record["reference_norms"]):
                assert abs(norm - ref_norm) < 1e-5 and norm > 0.05, record   # 0.05: the clip
            # the shards: 16x8/2 embedding + (8x16+16)/2 fc + 16x8/2 proj + 8 proj bias + 8x16/2 head
            assert record["local_params"] == 64 + 72 + 64 + 8 + 64, record
            # DeepSpeed's accessors under mpu=: the tensor size, the job's rank, the data size, the job's size
            assert record["mp_world_size"] == 2 and record["dp_world_size"] == 2, record
            assert record["world_size"] == 4, record
            assert record["global_rank"] == record["rank"], record


def test_checkpoint_on_tensor_2_x_data_2_resumes_on_tensor_2_x_data_1(tmp_path):
    folder = str(tmp_path / "ckpt")
    saved = [r for result in check(run_world(WORKER, 4, "0,1,2,3", "save", folder, timeout=300))
             for r in result.records()]
    assert all(r["global_steps"] == 2 and r["max_abs_error"] < 1e-5 for r in saved), saved
    names = sorted(p.name for p in (tmp_path / "ckpt" / "stage_1" / "global_step2").iterdir())
    assert names == ["digests.json", "metadata.json", "model_00-model_states.pt", "model_00-rank_0_shard.pt",
                     "model_00-rank_1_shard.pt", "model_01-metadata.json", "model_01-model_states.pt",
                     "model_01-rank_0_shard.pt", "model_01-rank_1_shard.pt"]   # one set per tensor rank
    # the digest manifest covers every tensor rank's files, not only tensor rank 0's
    manifest = json.loads((tmp_path / "ckpt" / "stage_1" / "global_step2" / "digests.json").read_text())
    assert sorted(manifest["files"]) == [n for n in names if n != "digests.json"], manifest
    # save_16bit_model: DeepSpeed's file holds global rank 0's (tensor rank 0's) shards; tensor rank 1's beside it
    for stage in range(4):
        files = sorted(p.name for p in (tmp_path / "ckpt" / f"stage_{stage}" / "16bit").iterdir())
        assert files == ["model.bin", "model_01-model.bin"], (stage, files)
        shards = [torch.load(tmp_path / "ckpt" / f"stage_{stage}" / "16bit" / name) for name in files]
        assert shards[0]["head.weight"].shape == shards[1]["head.weight"].shape == (8, 8)   # vocab 16 / 2
        assert not torch.equal(shards[0]["head.weight"], shards[1]["head.weight"])
    assert all(r["saved_16bit"] for r in saved), saved
    resumed = check(run_world(WORKER, 2, "0,1,2,3", "resume", folder, timeout=300))
    errors = []
    for result in resumed:
        for record in result.records():
            assert record["dp"] == 1 and record["global_steps"] == 4, record
            assert record["max_abs_error"] < 1e-5 and record["consolidated_error"] < 1e-5, record
            assert len(record["norms"]) == 2
            for norm, ref_norm in zip(record["norms"], record["reference_norms"]):
                assert abs(norm - ref_norm) < 1e-5 and norm > 0.05, record
            errors.append((record["stage"], record["max_abs_error"], record["consolidated_error"]))
    print("tensor 2: data 2 -> 1 resume, (stage, max abs error, consolidated error):", errors)
