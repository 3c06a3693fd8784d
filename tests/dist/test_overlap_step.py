"""offload_optimizer.overlap_step: the background CPU step gives the same bits as the plain one.

Runs this file as a script on 1 and 2 gloo ranks (tests/helpers/world.py). The CPU Adam is
slowed down (a sleep per 128-element chunk), so that the step is still running when the next
forward starts, and when the checkpoint is saved right after ``step()``: a missing wait reads
weights of the step before and the bits differ.
"""
import json
import os
import sys
import tempfile
import time

from tests.helpers import stage3_model as s3  # noqa: E402

STEPS = 4
GAS = 2
CLIP = 0.05


def slow_adam(params):
    from launcher.zero.optim.cpu_adam import CPUAdam

    class SlowAdam(CPUAdam):
        def _step_chunk(self, *args):
            time.sleep(0.003)
            return super()._step_chunk(*args)

    return SlowAdam(params, lr=s3.LR, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01, chunk_elements=128)


def config(stage, overlap):
    cfg = s3.config(GAS, CLIP, 64, stage=stage)
    cfg.pop("optimizer")
    cfg["zero_allow_untested_optimizer"] = True   # the slowed-down CPUAdam subclass
    cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": s3.LR,
                                                       "warmup_num_steps": 3, "warmup_type": "linear"}}
    zero_cfg = cfg["zero_optimization"]
    zero_cfg["offload_optimizer"] = {"device": "cpu", "overlap_step": overlap}
    if stage != 3:
        for key in [k for k in zero_cfg if k.startswith("stage3_")]:
            del zero_cfg[key]
    return cfg


def run(stage, overlap, rank, world_size, save_dir):
    import torch
    from launcher import zero
    model = s3.make_model()
    engine, opt, _, _ = zero.initialize(model=model, model_parameters=s3.groups(model), optimizer=slow_adam,
                                        config=config(stage, overlap))
    s3.train(engine, rank, world_size, GAS, steps=STEPS)
    engine.save_checkpoint(save_dir, tag="last")   # right after step(): must hold the stepped weights
    weights = {k: v.clone() for k, v in engine.module_state_dict().items()}
    moments = [t.clone() for st in opt.state.values() for t in st.values() if torch.is_tensor(t) and t.dim() > 0]
    lrs = engine.get_lr()
    engine.destroy()
    saved = zero.get_fp32_state_dict_from_zero_checkpoint(save_dir, tag="last") if rank == 0 else None
    return weights, moments, lrs, saved


def case(stage, rank, world_size):
    import torch
    # one folder for every rank of this run (the port is unique to it)
    base_dir = os.path.join(tempfile.gettempdir(), f"overlap-step-{os.environ['MASTER_PORT']}")
    plain = run(stage, False, rank, world_size, os.path.join(base_dir, f"plain{stage}"))
    started = time.perf_counter()
    overlapped = run(stage, True, rank, world_size, os.path.join(base_dir, f"overlap{stage}"))
    seconds = time.perf_counter() - started
    weights_equal = all(torch.equal(plain[0][k], overlapped[0][k]) for k in plain[0])
    moments_equal = len(plain[1]) == len(overlapped[1]) and all(torch.equal(a, b) for a, b in zip(plain[1], overlapped[1]))
    saved_equal = None
    if rank == 0:
        saved_equal = all(torch.equal(plain[3][k], overlapped[3][k]) for k in plain[3]) \
            and all(torch.equal(overlapped[3][k].to(overlapped[0][k].dtype), overlapped[0][k]) for k in plain[3])
    ref = s3.reference(world_size, GAS, CLIP, 0)   # the untrained model: the weights must have moved
    moved = max((overlapped[0][n] - p).abs().max().item() for n, p in ref.named_parameters())
    return {"stage": stage, "world_size": world_size, "weights_equal": weights_equal, "moments_equal": moments_equal,
            "saved_equal": saved_equal, "lrs_equal": plain[2] == overlapped[2], "moved": moved,
            "moment_count": len(plain[1]), "overlap_seconds": round(seconds, 3)}


def main():
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for stage in (2, 3):
        print("RESULT " + json.dumps(case(stage, rank, world_size)), flush=True)


def _check(world_size):
    from tests.helpers.world import check, run_world
    results = check(run_world(__file__, world_size, timeout=240))
    for result in results:
        records = result.records()
        assert [r["stage"] for r in records] == [2, 3], result.stdout
        for r in records:
            assert r["weights_equal"] and r["moments_equal"] and r["lrs_equal"], r
            assert r["moment_count"] > 0 and r["moved"] > 1e-4, r
            if result.rank == 0:
                assert r["saved_equal"], r


def test_overlap_step_is_bit_identical_on_one_rank():
    _check(1)


def test_overlap_step_is_bit_identical_on_two_gloo_ranks():
    _check(2)


if __name__ == "__main__":
    sys.exit(main())
