"""The engine's own compile: the ``compile`` config section and ``engine.compile()`` train as eager.

Runs this file as a script on 2 gloo ranks (tests/helpers/world.py) with the ``aot_eager`` backend
(dynamo and AOTAutograd, no generated code). Every stage 0-3 trains the same GPT eagerly and
compiled, through the config (``"compile": {"enabled": true}``) at stages 0, 2 and 3 and through
``engine.compile()`` at stages 1 and 3; the losses and weights must agree, the engine must say it
is compiled, a second ``engine.compile()`` must change nothing, and ``destroy`` must give the
module its own forward back. (The per-block machinery itself: test_compile_regions.py.)
"""
import json
import os
import sys

STEPS = 3
BACKEND = "aot_eager"
#: (stage, how): "config" puts the compile section in the config, "call" calls engine.compile()
RUNS = ((0, "config"), (1, "call"), (2, "config"), (3, "config"), (3, "call"))


def config(stage, compiled):
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
           "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 100,
                                 "reduce_bucket_size": 5000, "stage3_prefetch_bucket_size": 3000},
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
           "steps_per_print": 10**9}
    if compiled:
        cfg["compile"] = {"enabled": True, "backend": BACKEND, "kwargs": {"dynamic": False}}
    return cfg


def run(stage, how, rank):
    import torch
    from launcher import zero
    from launcher.zero.engine.compiling import compile_stats
    from tests.helpers.gpt import GPT, GPTConfig, train_on_random_tokens

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_embd=32, n_head=4, seq_len=16, vocab_size=96))
    engine, _, _, _ = zero.initialize(model=model, config=config(stage, how == "config"))
    if how == "call":
        engine.compile(backend=BACKEND, compile_kwargs={"dynamic": False})
    compiled_before = engine.is_compiled
    regions = engine._compiled.regions if engine._compiled is not None else []
    if how is not None:
        engine.compile(backend="eager")   # a second call changes nothing (DeepSpeed's rule)
    same_regions = (engine._compiled.regions if engine._compiled is not None else []) == regions
    losses = train_on_random_tokens(engine, rank, STEPS)
    weights = {k: v.float().clone() for k, v in engine.module_state_dict().items()}
    engine.destroy()
    replaced_after = sum("forward" in m.__dict__ for m in model.modules())
    return {"losses": losses, "weights": weights, "is_compiled": compiled_before, "regions": len(regions),
            "same_regions": same_regions, "replaced_after_destroy": replaced_after, "stats": compile_stats()}


def main():
    rank = int(os.environ["RANK"])
    eager = {}
    for stage, how in RUNS:
        if stage not in eager:
            eager[stage] = run(stage, None, rank)
        compiled = run(stage, how, rank)
        base = eager[stage]
        diff = max((base["weights"][k] - compiled["weights"][k]).abs().max().item() for k in base["weights"])
        print("RESULT " + json.dumps({
            "stage": stage, "how": how, "eager": base["losses"], "compiled": compiled["losses"],
            "weight_diff": diff, "eager_is_compiled": base["is_compiled"],
            **{k: compiled[k] for k in ("is_compiled", "regions", "same_regions", "replaced_after_destroy",
                                        "stats")}}), flush=True)


def test_config_and_engine_compile_train_like_eager_on_two_gloo_ranks():
    from tests.helpers.world import check, run_world

    for result in check(run_world(__file__, 2, timeout=400)):
        records = result.records()
        assert [(r["stage"], r["how"]) for r in records] == list(RUNS), result.stdout
        for r in records:
            assert all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(r["compiled"], r["eager"])), r
            assert r["weight_diff"] <= 1e-6, r
            assert r["is_compiled"] and not r["eager_is_compiled"], r
            assert r["same_regions"] and r["replaced_after_destroy"] == 0, r
            assert r["stats"]["unique_graphs"] >= 1 and r["stats"]["graph_breaks"] == 0, r["stats"]
            # stage 3 per block (the GPT's 2 blocks) and the module's forward around them, the whole
            # module below
            assert r["regions"] == (3 if r["stage"] == 3 else 1), r


if __name__ == "__main__":
    sys.exit(main())
