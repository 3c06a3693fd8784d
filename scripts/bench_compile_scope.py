"""Host time of one stage-3 compiled step per compile scope (issue 39), on the CPU.

Each scope runs in its own process (world size 1, fp32, the ``aot_eager`` backend unless
``--backend``), rounds alternating the scopes so that a busy machine slows both alike. A step is
forward, backward and optimizer step of the bench GPT on a model small enough that the host's
Python, not the arithmetic, sets the time. Prints per scope the minimum and median step ms over
all rounds (the minimum: least disturbed by other load), the process CPU ms per step, and dynamo's
counts (graphs, breaks, recompiles, skipped frames), then one JSON line.

    python scripts/bench_compile_scope.py                     # blocks vs blocks_and_top
    python scripts/bench_compile_scope.py --model llama --rounds 5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scopes", default="blocks,blocks_and_top", help="CompileSettings.scope values")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20, help="timed steps per round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=256, help="256: the blocks' matrices are partitioned")
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--backend", default="aot_eager")
    p.add_argument("--model", choices=("gpt", "llama"), default="gpt",
                   help="llama: a Hugging Face LlamaForCausalLM of the same shape, loss from labels")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def build(args):
    """The bench GPT, or a Llama of its shape."""
    if args.model == "llama":
        import transformers
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=args.vocab, hidden_size=args.width, intermediate_size=4 * args.width,
            num_hidden_layers=args.layers, num_attention_heads=4, max_position_embeddings=args.seq + 1))
    from tests.helpers.gpt import GPT, GPTConfig
    return GPT(GPTConfig(n_layer=args.layers, n_embd=args.width, n_head=4, seq_len=args.seq, vocab_size=args.vocab))


def worker(args) -> dict:
    """One process: build, compile with ``args.worker`` as the scope, time the steps."""
    import torch
    from launcher import zero
    from launcher.zero.engine.compiling import CompileSettings, compile_for_strategy, compile_stats

    torch.manual_seed(0)
    model = build(args)
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "steps_per_print": 10**9}
    engine, _, _, _ = zero.initialize(model=model, config=config)
    compile_for_strategy(engine.module, engine.strategy, CompileSettings(backend=args.backend, scope=args.worker))
    tokens = torch.randint(0, args.vocab, (2, args.seq + 1))
    wall, cpu = [], []
    for index in range(args.warmup + args.steps):
        started, started_cpu = time.perf_counter(), time.process_time()
        loss = (engine(tokens[:, :-1], tokens[:, 1:]) if args.model == "gpt"
                else engine(input_ids=tokens, labels=tokens).loss)
        engine.backward(loss)
        engine.step()
        if index >= args.warmup:
            wall.append((time.perf_counter() - started) * 1e3)
            cpu.append((time.process_time() - started_cpu) * 1e3)
    stats = compile_stats()
    engine.destroy()
    return {"wall_ms": wall, "cpu_ms": cpu, "stats": {k: stats[k] for k in (
        "unique_graphs", "graph_breaks", "recompiles", "frames_compiled", "frames_skipped")}}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    scopes = args.scopes.split(",")
    runs: dict[str, list[dict]] = {scope: [] for scope in scopes}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p),
               OMP_NUM_THREADS="1")
    for _ in range(args.rounds):
        for scope in scopes:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--worker", scope],
                                 env=env, capture_output=True, text=True, check=True).stdout
            runs[scope].append(json.loads(out.strip().splitlines()[-1]))
    summary = {}
    for scope, records in runs.items():
        wall = [t for r in records for t in r["wall_ms"]]
        cpu = [t for r in records for t in r["cpu_ms"]]
        summary[scope] = {"min_ms": round(min(wall), 2), "median_ms": round(statistics.median(wall), 2),
                          "cpu_median_ms": round(statistics.median(cpu), 2), **records[-1]["stats"]}
        s = summary[scope]
        print(f"{scope:16s} step ms min {s['min_ms']:8.2f} median {s['median_ms']:8.2f} cpu {s['cpu_median_ms']:8.2f}"
              f"  graphs {s['unique_graphs']} breaks {s['graph_breaks']} recompiles {s['recompiles']}"
              f" frames compiled {s['frames_compiled']} skipped {s['frames_skipped']}", file=sys.stderr)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
