"""torch.compile of the engine's module (launcher.zero.engine.compiling): the same training as eager.

Runs this file as a script on 1 and 2 gloo ranks (tests/helpers/world.py), with the ``aot_eager``
backend (dynamo and AOTAutograd, no code generation: what inductor compiles, run as eager ops).
At stage 3 each block is compiled and gathered as one unit, and so is the module's forward around
them (what is outside the blocks gathered as one more unit), the saved-tensor hooks still replace
the parameters that the compiled backward keeps, and every partitioned parameter is released
after the step. Stages 0-2 compile the whole module. ``TEST_COMPILE_BACKEND=inductor`` runs the
same check through inductor's generated code (minutes on a small CPU machine).
"""
import json
import os
import sys

STEPS = 4


def config(stage):
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 100,
                                  "reduce_bucket_size": 5000, "stage3_prefetch_bucket_size": 3000},
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
            # this test compiles below engine.compile() (compile_for_strategy), which is what takes the
            # inf/NaN trace's hooks off; its hooks would break the graphs counted here
            "non_finite": {"trace": False},
            "steps_per_print": 10**9}


def run(stage, backend, rank):
    import torch
    from launcher import zero
    from launcher.zero.engine.compiling import CompileSettings, compile_for_strategy, compile_stats
    from tests.helpers.gpt import GPT, GPTConfig, train_on_random_tokens

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()   # per run: the stats below are this run's
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=3, n_embd=32, n_head=4, seq_len=16, vocab_size=96))
    engine, _, _, _ = zero.initialize(model=model, config=config(stage))
    compiled = None
    if backend:
        compiled = compile_for_strategy(engine.module, engine.strategy, CompileSettings(backend=backend))
    losses = train_on_random_tokens(engine, rank, STEPS)
    held = sum(p.numel() for p in engine.module.parameters() if getattr(p, "ds_state", None) is not None)
    weights = {k: v.float().clone() for k, v in engine.module_state_dict().items()}
    engine.destroy()
    return {"losses": losses, "held_after_step": held, "weights": weights,
            "scope": compiled and compiled.scope, "regions": compiled and len(compiled.regions),
            "stats": compile_stats()}


def main():
    rank = int(os.environ["RANK"])
    for stage in (0, 2, 3):
        eager = run(stage, None, rank)
        compiled = run(stage, os.environ.get("TEST_COMPILE_BACKEND", "aot_eager"), rank)
        diff = max((eager["weights"][k] - compiled["weights"][k]).abs().max().item() for k in eager["weights"])
        moved = max((eager["weights"][k] - v).abs().max().item()
                    for k, v in run_untrained_weights().items())
        print("RESULT " + json.dumps({
            "stage": stage, "eager": eager["losses"], "compiled": compiled["losses"], "weight_diff": diff,
            "moved": moved, "held_after_step": compiled["held_after_step"], "scope": compiled["scope"],
            "regions": compiled["regions"], "stats": compiled["stats"]}), flush=True)


def run_untrained_weights():
    import torch
    from tests.helpers.gpt import GPT, GPTConfig, train_on_random_tokens

    torch.manual_seed(0)
    return {k: v.float() for k, v in GPT(GPTConfig(n_layer=3, n_embd=32, n_head=4, seq_len=16,
                                                   vocab_size=96)).state_dict().items()}


def _check(world_size):
    from tests.helpers.world import check, run_world

    for result in check(run_world(__file__, world_size, timeout=300)):
        records = result.records()
        assert [r["stage"] for r in records] == [0, 2, 3], result.stdout
        for r in records:
            assert r["compiled"] == r["eager"] or all(abs(a - b) <= 1e-6 * abs(b) for a, b in
                                                      zip(r["compiled"], r["eager"])), r
            assert r["weight_diff"] <= 1e-6 and r["moved"] > 1e-3, r
            assert r["stats"]["graph_breaks"] == 0, r["stats"]
            if r["stage"] == 3:   # one graph for the three identical blocks, one for the head and loss
                # (the GPT's forward itself calls the blocks in a loop: dynamo runs its lines eagerly
                # and compiles token_loss_sum); nothing held after the step
                assert (r["scope"], r["regions"], r["stats"]["unique_graphs"]) == ("blocks_and_top", 4, 2), r
                assert r["stats"]["frames_skipped"] == 1, r["stats"]
                assert r["held_after_step"] == 0, r
            else:
                assert (r["scope"], r["regions"]) == ("module", 1), r


def test_compiled_training_equals_eager_on_one_rank():
    _check(1)


def test_compiled_training_equals_eager_on_two_gloo_ranks():
    _check(2)


if __name__ == "__main__":
    sys.exit(main())
