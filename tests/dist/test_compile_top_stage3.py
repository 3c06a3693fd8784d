"""Stage 3 compiled beyond the blocks (launcher.zero.engine.compiling, scope "blocks_and_top"):
the code around the blocks, the LM head and the loss among it, runs in a compiled graph, and
training is the same as eager.

Runs this file as a script on 2 gloo ranks (tests/helpers/world.py) with the ``aot_eager``
backend, wrapped in a backend that records the ops of every graph it is handed. For the bench's
GPT and two Hugging Face models built from a config (Llama and GPT-2, a loss from labels) the
stage-3 compiled losses equal the eager ones step by step, each rank compiled graphs, nothing
recompiled, the cross-entropy ran inside a compiled graph (before the top was compiled it ran
eagerly), and ``destroy`` gave every replaced ``forward`` back.
"""
import json
import os
import sys

STEPS = 5
MODELS = ("gpt", "llama", "gpt2")


def config():
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100,
                                  "reduce_bucket_size": 5000, "stage3_prefetch_bucket_size": 3000},
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
            "steps_per_print": 10**9}


def build(name):
    import torch
    torch.manual_seed(0)
    if name == "gpt":
        from tests.helpers.gpt import GPT, GPTConfig
        return GPT(GPTConfig(n_layer=3, n_embd=32, n_head=4, seq_len=16, vocab_size=96))
    import transformers
    if name == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32))
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=96, n_embd=32, n_layer=3, n_head=4, n_positions=32))


def train(engine, name, rank):
    import torch
    gen = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(STEPS):
        tokens = torch.randint(0, 96, (2, 17), generator=gen)
        if name == "gpt":
            loss = engine(tokens[:, :-1], tokens[:, 1:])
        else:
            loss = engine(input_ids=tokens, labels=tokens).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return losses


class Recording:
    """A torch.compile backend: aot_eager, noting each graph's ops (``seen``)."""

    def __init__(self):
        self.seen = []

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.common import aot_autograd
        from torch._dynamo.backends.debugging import boxed_nop
        self.seen.append(gm.code)

        def noted(graph, inputs):
            self.seen.append(graph.code)
            return boxed_nop(graph, inputs)
        return aot_autograd(fw_compiler=noted, bw_compiler=noted)(gm, example_inputs)


def run(name, rank, compiled):
    import torch
    from launcher import zero
    from launcher.zero.engine.compiling import compile_stats

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = build(name)
    engine, _, _, _ = zero.initialize(model=model, config=config())
    backend = Recording()
    if compiled:
        engine.compile(backend=backend)
    scope = engine._compiled.scope if compiled else None
    losses = train(engine, name, rank)
    stats = compile_stats()
    engine.destroy()
    loss_compiled = any("cross_entropy" in code or "nll_loss" in code for code in backend.seen)
    return {"losses": losses, "stats": stats, "scope": scope, "loss_compiled": loss_compiled,
            "replaced_after_destroy": sum("forward" in m.__dict__ for m in model.modules())}


def main():
    rank = int(os.environ["RANK"])
    for name in MODELS:
        eager, compiled = run(name, rank, False), run(name, rank, True)
        print("RESULT " + json.dumps({"model": name, "eager": eager["losses"], **compiled}), flush=True)


def test_stage3_compiles_the_loss_and_trains_like_eager_on_two_gloo_ranks():
    from tests.helpers.world import check, run_world

    for result in check(run_world(__file__, 2, timeout=500)):
        records = result.records()
        assert [r["model"] for r in records] == list(MODELS), result.stdout
        for r in records:
            assert all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(r["losses"], r["eager"])), r
            assert r["loss_compiled"], r   # main (blocks alone) ran the loss eagerly
            assert r["scope"] == "blocks_and_top", r
            assert r["stats"]["unique_graphs"] > 0 and r["stats"]["recompiles"] == 0, r["stats"]
            assert r["replaced_after_destroy"] == 0, r


if __name__ == "__main__":
    sys.exit(main())
