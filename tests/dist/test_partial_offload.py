"""offload_optimizer.ratio at stage 3 on 2 gloo ranks: part of the optimizer states stays on the device.

On a CPU host the "device" is the CPU too, so what a user would notice is the losses: every ratio
trains like full offload (ratio 1.0), with gradient clipping on (one global norm over both parts),
with and without overlap_step, in fp32 and bf16, and a checkpoint saved at one ratio resumes at another (the
checkpoint holds every parameter's master and moments, wherever they lived). ``sub_group_size`` 200
cuts the 7-64-64-3 MLP into 4 of DeepSpeed's sub-groups on 2 ranks (shares 224, 2048, 96 | 66), so
ratio 0.5 keeps the first two weights' states on the device and splits the first optimizer group.

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
RATIOS = (1.0, 0.5, 0.25, 0.0)
#: per optimizer group (weights, biases), how many leading parameters keep their states on the
#: device on 2 ranks: DeepSpeed's rule by hand (4 sub-groups; int((1 - ratio) * 4) stay)
KEPT = {1.0: [0, 0], 0.5: [2, 0], 0.25: [3, 0], 0.0: [3, 3]}
TOLERANCE = 1e-6


def config(ratio, overlap=False, bf16=False):
    cfg = s3.config(GAS, CLIP, 64, sub_group_size=SUB_GROUP)
    cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "ratio": ratio, "overlap_step": overlap}
    if bf16:
        cfg["bf16"] = {"enabled": True}
    return cfg


def run(ratio, rank, world_size, overlap=False, first=0, last=STEPS, load=None, save=None, bf16=False):
    """Steps [first, last) at ``ratio``: (losses, per group the parameters kept on the device)."""
    import torch
    from launcher import zero
    model = s3.make_model()
    engine, opt, _, _ = zero.initialize(model=model, model_parameters=s3.groups(model),
                                        config=config(ratio, overlap, bf16))
    dtype = torch.bfloat16 if bf16 else torch.float32
    if load is not None:
        engine.load_checkpoint(load, tag="mid")
    x, y = s3.data(world_size, GAS, STEPS)
    losses = []
    for step in range(first, last):
        for micro in range(GAS):
            start = ((step * GAS + micro) * world_size + rank) * s3.MBS
            out = engine(x[start:start + s3.MBS].to(dtype)).float()
            loss = torch.nn.functional.mse_loss(out, y[start:start + s3.MBS])
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    if save is not None:
        engine.save_checkpoint(save, tag="mid")
    strategy = engine.strategy
    kept = []
    for group in opt.param_groups:
        positions = [i for i, master in enumerate(strategy.masters) if any(master is m for m in group["params"])]
        kept.append(sum(len(strategy.group_params[i]) for i in positions if strategy.on_device[i]))
    engine.destroy()
    return losses, kept


def checkpoints(rank, world_size):
    """Save after 3 steps at one ratio, resume the last 2 at another: the losses of a straight run."""
    folder = os.path.join(tempfile.gettempdir(), f"partial-offload-{os.environ['MASTER_PORT']}")
    out = {}
    for saved, loaded in ((0.5, 0.5), (0.5, 1.0), (1.0, 0.5), (0.25, 0.0)):
        path = os.path.join(folder, f"{saved}-{loaded}")
        head, _ = run(saved, rank, world_size, last=3, save=path)
        tail, _ = run(loaded, rank, world_size, first=3, load=path)
        out[f"{saved}->{loaded}"] = head + tail
    return out


def main():
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for overlap in (False, True):
        for ratio in RATIOS:
            losses, kept = run(ratio, rank, world_size, overlap=overlap)
            print("RESULT " + json.dumps({"kind": "train", "ratio": ratio, "overlap": overlap, "losses": losses,
                                          "kept": kept}), flush=True)
    for overlap in (False, True):   # bf16 weights and gradients, fp32 masters: the kept part's cast
        runs = {ratio: run(ratio, rank, world_size, overlap=overlap, bf16=True)[0] for ratio in (1.0, 0.5)}
        print("RESULT " + json.dumps({"kind": "bf16", "overlap": overlap, "runs": runs}), flush=True)
    print("RESULT " + json.dumps({"kind": "checkpoint", "runs": checkpoints(rank, world_size)}), flush=True)


def test_every_ratio_trains_like_full_offload_and_checkpoints_cross_ratios():
    from tests.helpers.world import check, run_world
    for result in check(run_world(__file__, 2, timeout=400)):
        records = result.records()
        trained = [r for r in records if r["kind"] == "train"]
        assert [(r["ratio"], r["overlap"]) for r in trained] == [(r, o) for o in (False, True) for r in RATIOS]
        full = trained[0]["losses"]
        assert len(full) == STEPS * GAS and len(set(full)) > 1
        for r in trained:
            assert r["kept"] == KEPT[r["ratio"]], r
            gap = max(abs(a - b) for a, b in zip(r["losses"], full))
            assert gap <= TOLERANCE, (r["ratio"], r["overlap"], gap, r["losses"], full)
        bf16 = [r for r in records if r["kind"] == "bf16"]
        assert [r["overlap"] for r in bf16] == [False, True]
        for r in bf16:
            full_bf16, half = r["runs"]["1.0"], r["runs"]["0.5"]
            assert len(half) == STEPS * GAS and max(abs(a - b) for a, b in zip(half, full_bf16)) <= TOLERANCE, r
        (resumed,) = [r for r in records if r["kind"] == "checkpoint"]
        for name, losses in resumed["runs"].items():
            gap = max(abs(a - b) for a, b in zip(losses, full))
            assert len(losses) == len(full) and gap <= TOLERANCE, (name, gap, losses, full)


if __name__ == "__main__":
    sys.exit(main())
