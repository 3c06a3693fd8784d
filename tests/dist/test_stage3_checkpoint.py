"""A stage-3 checkpoint saved on 2 ranks, resumed on 3, equals an uninterrupted reference run.

Phase ``save`` (2 ranks): 2 steps, save_checkpoint, consolidate to fp32 on rank 0. Phase
``resume`` (3 ranks): load, 2 more steps. The reference replays the same global batches in one
process with torch.optim.AdamW.
"""
import json
import os
import sys

from tests.helpers import stage3_model as s3  # noqa: E402

GAS, CLIP = 2, 0.05
SAVED_AT = 2


def batches(world_size, step):
    """The global batch of ``step`` for a run on ``world_size`` ranks (rows of s3.data)."""
    x, y = s3.data(world_size, GAS, step + 1)
    per_step = GAS * world_size * s3.MBS
    return x[step * per_step:(step + 1) * per_step], y[step * per_step:(step + 1) * per_step]


def run_steps(engine, rank, world_size, steps):
    import torch
    for step in steps:
        x, y = batches(world_size, step)
        for micro in range(GAS):
            start = (micro * world_size + rank) * s3.MBS
            loss = torch.nn.functional.mse_loss(engine(x[start:start + s3.MBS]), y[start:start + s3.MBS])
            engine.backward(loss)
            engine.step()


def reference(schedule):
    import torch
    model = s3.make_model()
    opt = torch.optim.AdamW(s3.groups(model), lr=s3.LR, betas=(0.9, 0.99), eps=1e-8)
    for step, world_size in enumerate(schedule):
        x, y = batches(world_size, step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
    return model


def main():
    from launcher import zero
    phase, ckpt_dir = sys.argv[1], sys.argv[2]
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # the resumed run starts from other weights: the load must overwrite everything
    model = s3.make_model(seed=0 if phase == "save" else 123)
    engine, _, _, _ = zero.initialize(model=model, model_parameters=s3.groups(model),
                                      config=s3.config(GAS, CLIP, 64))
    record = {"phase": phase, "rank": rank}
    if phase == "save":
        run_steps(engine, rank, world_size, range(SAVED_AT))
        engine.save_checkpoint(ckpt_dir, client_state={"note": "two ranks"})
        full = s3.full_params(engine)
        if rank == 0:
            state = zero.get_fp32_state_dict_from_zero_checkpoint(ckpt_dir)
            record["consolidated_error"] = max((state[n] - t).abs().max().item() for n, t in full.items())
            record["consolidated_shapes"] = {n: list(t.shape) for n, t in state.items()}
        record["error_vs_reference"] = s3.max_error(engine, reference([world_size] * SAVED_AT))
    else:
        path, client = engine.load_checkpoint(ckpt_dir)
        record["client_state"] = client
        record["global_steps_loaded"] = engine.global_steps
        run_steps(engine, rank, world_size, range(SAVED_AT, SAVED_AT + 2))
        record["error_vs_reference"] = s3.max_error(engine, reference([2] * SAVED_AT + [world_size] * 2))
        record["global_steps"] = engine.global_steps
    print("RESULT " + json.dumps(record), flush=True)


def test_stage3_checkpoint_saved_on_2_ranks_resumes_on_3(tmp_path):
    from tests.helpers.world import check, run_world
    ckpt = str(tmp_path / "ckpt")
    saved = [r.records()[0] for r in check(run_world(__file__, 2, "save", ckpt, timeout=180))]
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "global_step2"
    assert saved[0]["consolidated_error"] == 0.0
    assert saved[0]["consolidated_shapes"]["2.weight"] == [64, 64]
    assert all(r["error_vs_reference"] < 1e-5 for r in saved), saved
    resumed = [r.records()[0] for r in check(run_world(__file__, 3, "resume", ckpt, timeout=180))]
    for r in resumed:
        assert r["client_state"] == {"note": "two ranks"} and r["global_steps_loaded"] == SAVED_AT
        assert r["global_steps"] == SAVED_AT + 2
        assert r["error_vs_reference"] < 1e-5, r


if __name__ == "__main__":
    main()
