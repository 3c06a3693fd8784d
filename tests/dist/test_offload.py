"""ZeRO-Offload on 2 gloo ranks: masters and optimizer state on the host, parity with AdamW.

Runs this file as a script (tests/helpers/world.py); cases reuse test_stage3's model, data and
single-process reference.
"""
import json
import os

from tests.helpers import stage3_model as s3  # noqa: E402


def case(rank, world_size, stage, offload_param=False, client_cpu_adam=False, gas=2, clip=0.05):
    from launcher import zero
    from launcher.zero.optim.cpu_adam import CPUAdam
    model = s3.make_model()
    cfg = s3.config(gas, clip, 64, stage=stage)
    zero_cfg = cfg["zero_optimization"]
    zero_cfg["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if offload_param:
        zero_cfg["offload_param"] = {"device": "cpu"}
    if stage != 3:
        for key in list(zero_cfg):
            if key.startswith("stage3_"):
                del zero_cfg[key]
    optimizer = None
    if client_cpu_adam:
        cfg.pop("optimizer")
        optimizer = lambda params: CPUAdam(params, lr=s3.LR, betas=(0.9, 0.99), eps=1e-8, num_threads=2,  # noqa: E731
                                           chunk_elements=100)
    engine, opt, _, _ = zero.initialize(model=model, model_parameters=s3.groups(model), optimizer=optimizer,
                                        config=cfg)
    s3.train(engine, rank, world_size, gas)
    ref = s3.reference(world_size, gas, clip, s3.STEPS)
    if stage == 3:
        error = s3.max_error(engine, ref)
    else:
        error = max((a - b).abs().max().item() for a, b in zip(model.parameters(), ref.parameters()))
    masters = [p for g in opt.param_groups for p in g["params"]]
    states = [t for st in opt.state.values() for t in st.values() if hasattr(t, "device") and t.dim() > 0]
    shards = [p.ds_tensor for p in model.parameters() if hasattr(p, "ds_tensor")]
    return {"stage": stage, "offload_param": offload_param, "optimizer": type(opt.optimizer).__name__,
            "max_abs_error": error, "masters_on": sorted({m.device.type for m in masters}),
            "state_on": sorted({t.device.type for t in states}), "state_count": len(states),
            "shards_on": sorted({t.device.type for t in shards}), "memory": engine.memory_breakdown()}


def main():
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for kwargs in ({"stage": 1, "client_cpu_adam": True}, {"stage": 2}, {"stage": 3},
                   {"stage": 3, "offload_param": True, "client_cpu_adam": True}):
        print("RESULT " + json.dumps(case(rank, world_size, **kwargs)), flush=True)


def test_optimizer_and_param_offload_match_single_process_adamw():
    from tests.helpers.world import check, run_world
    results = check(run_world(__file__, 2, timeout=240))
    for result in results:
        records = result.records()
        assert [(r["stage"], r["offload_param"]) for r in records] == [(1, False), (2, False), (3, False), (3, True)]
        for r in records:
            assert r["max_abs_error"] < 1e-5, r
            assert r["masters_on"] == ["cpu"] and r["state_on"] == ["cpu"] and r["state_count"] > 0, r
            if r["stage"] < 3:   # stage 3 on a CPU-only host: the shard itself is the fp32 master (no copy)
                assert r["memory"]["master_weights"] > 0, r
        # a client CPUAdam (records 0, 3) or the config's AdamW, which offload builds as CPUAdam
        assert [r["optimizer"] for r in records] == ["CPUAdam"] * 4
        assert records[3]["shards_on"] == ["cpu"]


if __name__ == "__main__":
    main()
