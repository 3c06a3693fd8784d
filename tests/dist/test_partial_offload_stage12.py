"""offload_optimizer.ratio at stages 1 and 2, on 1 and 2 gloo ranks (issue 43 item 2's knob).

DeepSpeed 0.19.8 refuses ``ratio`` below 1 there; dslaunch cuts each rank's partition by the
stage-3 sub-group rule (stages/partial_offload.py). On a CPU host the "device" is the CPU too, so
what a user would notice is the losses: every ratio trains like full offload (ratio 1.0) and like
no offload, with gradient clipping on (one global norm over both parts), with and without
overlap_step, in fp32, bf16 and fp16; a checkpoint saved at ratio 0.5 resumes at 1.0 (and back)
as a straight run, and consolidates (zero_to_fp32) to the same weights whatever the ratio. Where
the states went is counted: the elements of the masters kept on the device against DeepSpeed's
rule by hand, and the host gradient buffers, which the kept part does not have.

``sub_group_size`` 200 cuts the 7-64-64-3 MLP (weights 448, 4096, 192; biases 64, 64, 3):
on 1 rank into 4 sub-groups ([448] [4096] [192] | [131]); on 2 ranks each rank's partition into 3
(rank 0: [448] [1920 of the second weight] | [66 of the biases]; rank 1: [2176] [192] | [66]).

Runs this file as a script (tests/helpers/world.py).
"""
import json
import os
import sys
import tempfile

from tests.helpers import stage3_model as s3  # noqa: E402

STEPS = 5
GAS = 2
CLIP = 0.05
SUB_GROUP = 200
RATIOS = (1.0, 0.5, 0.0)
#: (world size, rank) -> ratio -> elements of this rank's partition whose states stay on the device
KEPT = {(1, 0): {1.0: 0, 0.5: 448 + 4096, 0.0: 4736 + 131},
        (2, 0): {1.0: 0, 0.5: 448, 0.0: 2368 + 66},
        (2, 1): {1.0: 0, 0.5: 2176, 0.0: 2368 + 66}}
TOLERANCE = 1e-6   # the stage-3 ratio tests' (tests/dist/test_partial_offload.py)


def config(stage, ratio, overlap=False, precision=None):
    cfg = s3.config(GAS, CLIP, 64, stage=stage, sub_group_size=SUB_GROUP)
    cfg["zero_optimization"].pop("stage3_param_persistence_threshold")
    if ratio is not None:   # None: no offload
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "ratio": ratio, "overlap_step": overlap}
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    elif precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def run(stage, ratio, rank, world_size, overlap=False, precision=None, first=0, last=STEPS, load=None, save=None):
    """Steps [first, last): (losses, what the run placed where)."""
    import torch
    from launcher import zero
    model = s3.make_model()
    engine, _, _, _ = zero.initialize(model=model, model_parameters=s3.groups(model),
                                      config=config(stage, ratio, overlap, precision))
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)
    if load is not None:
        engine.load_checkpoint(load, tag="mid")
    x, y = s3.data(world_size, GAS, STEPS)
    losses = []
    for step in range(first, last):
        for micro in range(GAS):
            start = ((step * GAS + micro) * world_size + rank) * s3.MBS
            loss = torch.nn.functional.mse_loss(engine(x[start:start + s3.MBS].to(dtype)).float(),
                                                y[start:start + s3.MBS])
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    if save is not None:
        engine.save_checkpoint(save, tag="mid")
    placed = placement(engine) if ratio is not None else {}
    engine.destroy()
    return losses, placed


def placement(engine):
    """The kept elements, the host gradient bytes, where each master's moments live, and every
    parameter's fp32 master and moments as the tensor-fragment API reads them (collective)."""
    from launcher.zero import utils
    full = [utils.safe_get_full_fp32_param(p).double().sum().item() for p in engine.module.parameters()]
    for key in ("exp_avg", "exp_avg_sq"):
        full += [utils.safe_get_full_optimizer_state(p, key).double().sum().item() for p in engine.module.parameters()]
    strategy = engine.strategy
    kept = sum(p.high - p.low for p in strategy.pieces if p.on_device)
    moments_beside = all(engine.basic_optimizer.state[m]["exp_avg"].device == m.device for m in strategy.masters)
    kept_devices = sorted({m.device.type for m, p in zip(strategy.masters, strategy.pieces) if p.on_device})
    return {"kept": kept, "total": sum(m.numel() for m in strategy.masters), "moments_beside": moments_beside,
            "host_gradients": engine.memory_breakdown()["host_gradients"], "kept_devices": kept_devices,
            "masters_per_group": [len(g["params"]) for g in engine.basic_optimizer.param_groups], "full": full}


def checkpoints(stage, rank, world_size):
    """Save after 3 steps at one ratio, resume the last 2 at another; and the consolidated weights
    and moments of the same checkpoint saved at 0.5 and at 1.0."""
    import torch
    from launcher import zero
    folder = os.path.join(tempfile.gettempdir(), f"partial-offload-12-{os.environ['MASTER_PORT']}-{stage}")
    out = {}
    for saved, loaded in ((0.5, 1.0), (1.0, 0.5)):
        path = os.path.join(folder, f"{saved}-{loaded}")
        head, _ = run(stage, saved, rank, world_size, last=3, save=path)
        tail, _ = run(stage, loaded, rank, world_size, first=3, load=path)
        out[f"{saved}->{loaded}"] = head + tail
    gap = None
    if rank == 0:
        half, full = (zero.get_fp32_state_dict_from_zero_checkpoint(os.path.join(folder, name), tag="mid")
                      for name in ("0.5-1.0", "1.0-0.5"))
        moments = [_saved_moments(os.path.join(folder, name, "mid")) for name in ("0.5-1.0", "1.0-0.5")]
        gap = max([(half[k] - full[k]).abs().max().item() for k in full] +
                  [(moments[0][k] - moments[1][k]).abs().max().item() for k in moments[1]])
        assert set(half) == set(full) and set(moments[0]) == set(moments[1]) and len(moments[1]) >= 12
    torch.distributed.barrier()
    return out, gap


def _saved_moments(path):
    """Every (parameter, moment, start) slice of Adam's moments in a saved checkpoint's shards."""
    import glob

    import torch
    found = {}
    for name in sorted(glob.glob(os.path.join(path, "*rank*"))):
        shard = torch.load(name, weights_only=False)
        if not isinstance(shard, dict) or "fragments" not in shard:
            continue
        for record in shard["fragments"]:
            for key, value in record["state"].items():
                found[(record["name"], key, record["param_start"])] = value
    return found


def main():
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for stage in (1, 2):
        none, _ = run(stage, None, rank, world_size)
        print("RESULT " + json.dumps({"kind": "none", "stage": stage, "losses": none}), flush=True)
        for overlap in (False, True):
            for ratio in RATIOS:
                losses, placed = run(stage, ratio, rank, world_size, overlap=overlap)
                print("RESULT " + json.dumps({"kind": "train", "stage": stage, "ratio": ratio, "overlap": overlap,
                                              "losses": losses, **placed}), flush=True)
        for precision in ("bf16", "fp16"):
            for overlap in (False, True):
                runs = {r: run(stage, r, rank, world_size, overlap, precision)[0] for r in (1.0, 0.5)}
                print("RESULT " + json.dumps({"kind": precision, "stage": stage, "overlap": overlap, "runs": runs}),
                      flush=True)
        resumed, gap = checkpoints(stage, rank, world_size)
        print("RESULT " + json.dumps({"kind": "checkpoint", "stage": stage, "runs": resumed, "gap": gap}), flush=True)


def _gap(a, b):
    assert len(a) == len(b) == STEPS * GAS
    return max(abs(x - y) for x, y in zip(a, b))


def _check_rank(records, world_size, rank):
    for stage in (1, 2):
        trained = [r for r in records if r["kind"] == "train" and r["stage"] == stage]
        assert [(r["ratio"], r["overlap"]) for r in trained] == [(r, o) for o in (False, True) for r in RATIOS]
        full = trained[0]["losses"]
        assert len(set(full)) > 1
        (none,) = [r["losses"] for r in records if r["kind"] == "none" and r["stage"] == stage]
        assert _gap(none, full) <= TOLERANCE, (stage, none, full)
        for r in trained:
            assert _gap(r["losses"], full) <= TOLERANCE, (stage, r["ratio"], r["overlap"], r["losses"], full)
            assert r["kept"] == KEPT[(world_size, rank)][r["ratio"]], r
            assert r["moments_beside"] and r["kept_devices"] in ([], ["cpu"]), r
            host = (r["total"] - r["kept"]) * 4 * (2 if r["overlap"] else 1)   # fp32, two buffers with overlap
            assert r["host_gradients"] == host, r
            assert r["full"] == trained[0]["full"], (r["ratio"], r["overlap"])   # whatever the ratio
        assert trained[1]["masters_per_group"] == [2, 1], trained[1]   # ratio 0.5 cuts the weights group in two
        for precision in ("bf16", "fp16"):
            runs = [r for r in records if r["kind"] == precision and r["stage"] == stage]
            assert [r["overlap"] for r in runs] == [False, True]
            for r in runs:
                assert len(set(r["runs"]["1.0"])) > 1 and _gap(r["runs"]["0.5"], r["runs"]["1.0"]) <= TOLERANCE, r
        (resumed,) = [r for r in records if r["kind"] == "checkpoint" and r["stage"] == stage]
        for name, losses in resumed["runs"].items():
            assert _gap(losses, full) <= TOLERANCE, (stage, name, losses, full)
        if rank == 0:
            assert resumed["gap"] == 0.0, resumed   # the same weights and moments, wherever they lived


def _check(world_size):
    from tests.helpers.world import check, run_world
    for rank, result in enumerate(check(run_world(__file__, world_size, timeout=500))):
        _check_rank(result.records(), world_size, rank)


def test_ratio_at_stages_1_and_2_on_one_rank_trains_like_full_offload_and_checkpoints_across_ratios():
    _check(1)


def test_ratio_at_stages_1_and_2_on_two_ranks_trains_like_full_offload_and_checkpoints_across_ratios():
    _check(2)


if __name__ == "__main__":
    sys.exit(main())
