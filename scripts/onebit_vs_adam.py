"""1-bit Adam against Adam on the benchmark GPT, on CPU (gloo) at world size 2.

    python scripts/onebit_vs_adam.py                       # 400 steps, freeze at 100
    python scripts/onebit_vs_adam.py --steps 20 --freeze-step 5 --tiny   # a smoke run

Spawns WORLD_SIZE ranks (RANK/WORLD_SIZE/MASTER_ADDR=127.0.0.1/MASTER_PORT). Each rank trains
the same model twice from the same initial weights on its own batches of a synthetic Markov
language: once with torch.optim.Adam after a full-precision gradient all-reduce (what the
engine does at stage 0), once with OnebitAdam (which communicates by itself). Prints one
JSON document: both final held-out losses, their relative gap, and the bytes each rank sent
per step before and after the freeze against an fp32 gradient all-reduce.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--freeze-step", type=int, default=200)
    p.add_argument("--uncompressed", action="store_true",
                   help="also train OnebitAdam that never freezes (DeepSpeed's Adam without bias "
                        "correction), to separate what compression costs from what bias correction does")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=50, help="linear lr warm-up steps (both optimizers)")
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--tiny", action="store_true", help="a smaller model for smoke tests")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def model_config(tiny):
    from tests.helpers.gpt import GPTConfig

    if tiny:
        return GPTConfig(n_layer=1, n_embd=32, n_head=2, seq_len=32, vocab_size=64)
    return GPTConfig(n_layer=2, n_embd=128, n_head=4, seq_len=64, vocab_size=256)


def markov_batches(config, batch_size, seed):
    """Endless batches from a fixed random language: each token has 4 likely successors."""
    import torch

    table = torch.Generator().manual_seed(1234)  # the language: same on every rank
    successors = torch.randint(config.vocab_size, (config.vocab_size, 4), generator=table)
    gen = torch.Generator().manual_seed(seed)
    while True:
        tokens = torch.empty(batch_size, config.seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(config.vocab_size, (batch_size,), generator=gen)
        for t in range(config.seq_len):
            pick = torch.randint(4, (batch_size,), generator=gen)
            tokens[:, t + 1] = successors[tokens[:, t], pick]
        yield tokens[:, :-1], tokens[:, 1:]


def train(args, kind, rank, world_size):
    """Train one model with `kind` ('adam', 'onebit' or 'uncompressed'); returns held-out loss and bytes."""
    import torch
    import torch.distributed as dist
    from tests.helpers.gpt import GPT

    from launcher.zero.optim.onebit import OnebitAdam
    from launcher.zero.optim.onebit.counted_collectives import allreduce_sent_bytes

    config = model_config(args.tiny)
    torch.manual_seed(0)
    model = GPT(config)
    params = list(model.parameters())
    if kind in ("onebit", "uncompressed"):
        freeze_step = args.freeze_step if kind == "onebit" else args.steps + 1
        opt = OnebitAdam(params, lr=args.lr, freeze_step=freeze_step, comm_backend_name="gloo")
    else:
        opt = torch.optim.Adam(params, lr=args.lr)
    fp32_bytes = 4 * sum(p.numel() for p in params)
    data = markov_batches(config, args.batch_size, seed=1 + rank)
    comm = {"warmup": [], "compressed": []}
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / max(1, args.warmup))
        x, y = next(data)
        opt.zero_grad()
        model(x, y).backward()
        if kind == "adam":
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat)
            flat /= world_size
            for p, g in zip(params, flat.split([p.numel() for p in params])):
                p.grad.copy_(g.view_as(p))
        opt.step()
        if kind == "onebit":
            comm[opt.last_step_comm["phase"]].append(opt.last_step_comm["sent_bytes"])
    held_out = markov_batches(config, 32, seed=999)
    with torch.no_grad():
        loss = sum(model(*next(held_out)).item() for _ in range(4)) / 4
    result = {"loss": loss}
    if kind == "onebit":
        result["sent_bytes_per_step"] = {k: (max(v) if v else None) for k, v in comm.items()}
    result["fp32_allreduce_sent_bytes"] = allreduce_sent_bytes(fp32_bytes, world_size)
    result["params"] = sum(p.numel() for p in params)
    return result


def worker(args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    kinds = ("adam", "onebit", "uncompressed") if args.uncompressed else ("adam", "onebit")
    out = {kind: train(args, kind, rank, world_size) for kind in kinds}
    Path(args.worker, f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, argv):
    with tempfile.TemporaryDirectory() as out:
        port = str(free_port())
        procs = []
        for rank in range(args.world_size):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.world_size), LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, __file__, *argv, "--worker", out], env=env))
        codes = [p.wait() for p in procs]
        if any(codes):
            print(json.dumps({"error": f"rank exit codes {codes}"}))
            return 1
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(args.world_size)]
    adam, onebit = ranks[0]["adam"], ranks[0]["onebit"]
    fp32 = onebit["fp32_allreduce_sent_bytes"]
    compressed = onebit["sent_bytes_per_step"]["compressed"]
    report = {
        "world_size": args.world_size, "steps": args.steps, "freeze_step": args.freeze_step,
        "params": onebit["params"],
        "final_loss": {"adam": adam["loss"], "onebit_adam": onebit["loss"]},
        "loss_rel_gap": (onebit["loss"] - adam["loss"]) / adam["loss"],
        "loss_within_2pct": abs(onebit["loss"] - adam["loss"]) <= 0.02 * adam["loss"],
        "loss_same_on_all_ranks": len({round(r["onebit"]["loss"], 6) for r in ranks}) == 1,
        "bytes_per_step_per_rank": {"fp32_allreduce": fp32, "onebit_warmup": onebit["sent_bytes_per_step"]["warmup"],
                                    "onebit_compressed": compressed},
        "compressed_over_fp32": None if compressed is None else compressed / fp32,
    }
    if "uncompressed" in ranks[0]:
        plain = ranks[0]["uncompressed"]["loss"]
        report["final_loss"]["onebit_never_frozen"] = plain
        report["loss_rel_gap_vs_never_frozen"] = (onebit["loss"] - plain) / plain
    print(json.dumps(report, indent=2))
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    return launch(args, argv)


if __name__ == "__main__":
    sys.exit(main())
