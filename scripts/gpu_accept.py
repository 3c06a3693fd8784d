#!/usr/bin/env python3
"""The GPU tier's acceptance run (issue 39): real Hugging Face models under our engine, beside plain
PyTorch and DeepSpeed 0.19.8, one table that says which cells pass (docs/development/tests.md).

Llama (GQA), GPT-2, Qwen2 and Mixtral (accept_models.py), each at ZeRO 0-3 in bf16, stage 2 in fp16
and stages 2 and 3 with optimizer offload, under our engine and DeepSpeed with the same config,
seed and per-step batches; plain PyTorch trains each model in DeepSpeed's recipe (bf16 weights,
fp32 masters) and with harmless changes, which measures how far the model drifts by itself and so
sets its loss bound (accept_table.loss_bound); plus one stock Trainer run at ZeRO-3 (accept_trainer.py)
under plain PyTorch, ours (dslaunch --as-deepspeed) and DeepSpeed. An engine's cells of one model run
one after another in one process (accept_worker.py; plain's of every model in one), with a time limit
per cell: a crash or hang is a red cell and the run goes on in a new process. Every record is appended
to OUTDIR/cells.jsonl as it comes; the table goes to stdout and OUTDIR/accept.md; exit 1 if any
cell is red.

    scripts/gpu_runs.sh accept $OUT                                  # on the GPU machine
    python scripts/gpu_accept.py /tmp/acc --tiny --device cpu        # every path, on a CPU
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [p for p in (HERE, REPO) if p not in sys.path]

import accept_table as table  # noqa: E402
from accept_env import process_env, python_without_deepspeed  # noqa: E402
from accept_models import FULL, MODEL_NAMES, TINY  # noqa: E402

PLAIN_VARIANTS = ("plain", "plain_split", "plain_autocast", "plain_fp32", "plain_fp16")
VARIANTS = ("zero0", "zero1", "zero2", "zero3", "zero2_fp16", "zero2_offload", "zero3_offload")
TRAINER_CONFIG = {   # the Hugging Face docs' ZeRO-3 config: "auto" filled from TrainingArguments
    "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                          "stage3_gather_16bit_weights_on_model_save": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto", "steps_per_print": 1, "wall_clock_breakdown": False,
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("outdir")
    p.add_argument("--tiny", action="store_true", help="2-layer models, batch 2 x 64, 4 steps (a CPU check)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--models", default=",".join(MODEL_NAMES))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--no-trainer", action="store_true", help="leave out the Trainer cells")
    p.add_argument("--cell-timeout", type=float, default=90, help="seconds a cell (or a process start) may take")
    p.add_argument("--trainer-timeout", type=float, default=150, help="seconds per Trainer run")
    p.add_argument("--budget", type=float, default=0, help="seconds for the run; what has not started by then "
                   "is recorded 'not run' (0: no limit)")
    p.add_argument("--deepspeed-from", default="",
                   help="FILE[,FILE]: cells.jsonl of earlier runs whose DeepSpeed cells (and DeepSpeed's Trainer "
                        "cell) are taken instead of running DeepSpeed again, where their card is this run's (DeepSpeed "
                        "unchanged, only ours changed: it saves about 230 s of an H100 call); the header names them")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: judge OUTDIR/cells.jsonl of an earlier run again under today's bound rule")
    p.add_argument("--break", dest="broken", default="",
                   help="ENGINE:MODEL:VARIANT[=raise|exit|hang],...: cells made to fail (tests/smoke)")
    return p.parse_args(argv)


class Run:
    """The run's state: where records go, the clock, and the budget."""

    def __init__(self, args):
        self.args = args
        self.out = args.outdir
        self.results = os.path.join(self.out, "cells.jsonl")
        self.started = time.monotonic()

    def card(self) -> str | None:
        """The card this run's plain cells ran on, as accept_worker.py names it (None before they ran)."""
        cards = {r.get("device") for r in self.read(0)[0] if r.get("event") == "cell" and r.get("engine") == "plain"}
        cards.discard(None)
        return cards.pop() if len(cards) == 1 else None

    def record(self, **record) -> None:
        with open(self.results, "a") as f:
            f.write(json.dumps({"event": "cell", "time": time.time(), **record}) + "\n")
        self.say(record)

    def say(self, record: dict) -> None:
        reason = record.get("error") or ""
        print(f"[accept] {time.monotonic() - self.started:5.0f}s {record['model']} {record['variant']} "
              f"{record['engine']}: {record['status']} {reason}".rstrip(), flush=True)

    def over_budget(self) -> bool:
        return bool(self.args.budget) and time.monotonic() - self.started > self.args.budget

    def read(self, offset: int) -> tuple[list[dict], int]:
        with open(self.results) as f:
            f.seek(offset)
            text = f.read()
        complete = text[:text.rfind("\n") + 1]
        return [json.loads(line) for line in complete.splitlines() if line.strip()], offset + len(complete)

    def run_group(self, engine: str, cells: list[tuple[str, str]], label: str) -> None:
        """Run ``cells`` in one worker process, a new one after each crash or hang, until all have a record."""
        remaining = list(cells)
        broken = ",".join(b.split(":", 1)[1] for b in self.args.broken.split(",") if b.startswith(engine + ":"))
        attempt = 0
        while remaining:
            if self.over_budget():
                for name, variant in remaining:
                    self.record(model=name, variant=variant, engine=engine, status="not run",
                                error=f"budget of {self.args.budget:.0f}s spent")
                return
            attempt += 1
            done, current, why = self._one_process(engine, remaining, broken, f"{label}-{attempt}")
            remaining = [c for c in remaining if c not in done]
            if current is not None:   # the cell the process died or hung in
                status = "not run" if why.startswith("not run") else "error"
                self.record(model=current[0], variant=current[1], engine=engine, status=status, error=why)
                remaining.remove(current)
            elif remaining and not done:   # died before its first cell: nothing will work
                for name, variant in remaining:
                    self.record(model=name, variant=variant, engine=engine, status="error", error=why)
                return

    def _one_process(self, engine, cells, broken, label):
        log_path = os.path.join(self.out, f"{label}.log")
        argv = [sys.executable, "-u", os.path.join(HERE, "accept_worker.py"), "--engine", engine, "--results",
                self.results, "--device", self.args.device, "--cells", ",".join(f"{m}:{v}" for m, v in cells)]
        argv += (["--tiny"] if self.args.tiny else []) + (["--break", broken] if broken else [])
        _, offset = self.read(0)
        done, current, since = set(), None, time.monotonic()
        with open(log_path, "w") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=process_env(self.args.device),
                                    cwd=REPO, start_new_session=True)
            while True:
                exited = proc.poll() is not None
                records, offset = self.read(offset)
                for r in records:
                    key = (r["model"], r["variant"])
                    if r["event"] == "begin":
                        current, since = key, time.monotonic()
                    else:
                        done.add(key)
                        current = None if current == key else current
                        self.say(r)
                if exited:
                    break
                if self.over_budget():   # the budget is hard: the report still has time to run
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    return done, current, f"not run: budget of {self.args.budget:.0f}s spent mid-cell"
                if time.monotonic() - since > self.args.cell_timeout:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    return done, current, f"timed out after {self.args.cell_timeout:.0f}s (killed; see {label}.log)"
                time.sleep(0.2)
        return done, current, f"process exited {proc.returncode}: {tail(log_path)}"

    def run_trainer(self, engine: str, weights: str, config_path: str, flops_per_step: float) -> None:
        """One stock Trainer run (plain: no --deepspeed; ours: under dslaunch --as-deepspeed)."""
        shape = TINY if self.args.tiny else FULL
        variant = "trainer_plain" if engine == "plain" else "trainer_zero3"
        scratch = tempfile.mkdtemp(prefix=f"accept-trainer-{engine}-")
        report = os.path.join(scratch, "report.json")
        script = [os.path.join(HERE, "accept_trainer.py"), "--model_name_or_path", weights, "--seq_len", str(shape.seq),
                  "--output_dir", os.path.join(scratch, "run"), "--report", report, "--max_steps", str(shape.steps),
                  "--per_device_train_batch_size", str(shape.batch), "--learning_rate", "6e-4", "--weight_decay", "0.1",
                  "--adam_beta1", "0.9", "--adam_beta2", "0.95", "--adam_epsilon", "1e-8", "--max_grad_norm", "1.0",
                  "--lr_scheduler_type", "constant", "--warmup_steps", "0", "--logging_steps", "1",
                  "--save_strategy", "no", "--report_to", "none", "--bf16", "--seed", "0", "--disable_tqdm", "true",
                  "--dataloader_num_workers", "0"]
        script += ["--use_cpu"] if self.args.device == "cpu" else []
        script += ["--deepspeed", config_path] if engine != "plain" else []
        env = process_env(self.args.device)
        if engine == "ours":
            python = sys.executable
            if importlib.util.find_spec("deepspeed") is not None:   # the shim will not hide a real one
                try:
                    python, changes = python_without_deepspeed(os.path.join(scratch, "python"))
                except (OSError, subprocess.SubprocessError) as exc:
                    return self.record(model="llama", variant=variant, engine=engine, status="error",
                                       error=f"no Python without DeepSpeed for --as-deepspeed: {exc}"[:300])
                env.update(changes)
            argv = [python, "-m", "launcher", "--num_gpus", "1", "--as-deepspeed", "--no_local_rank",
                    "--master_port", env["MASTER_PORT"], *script]
            for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):   # dslaunch sets them
                env.pop(key)
        else:
            argv = [sys.executable, *script]
            if engine == "plain":
                for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                    env.pop(key)
        log_path = os.path.join(self.out, f"trainer-{engine}.log")
        common = {"model": "llama", "variant": variant, "engine": engine, "flops_per_step": flops_per_step,
                  **({"device": self.card()} if self.card() else {})}
        if self.over_budget():
            return self.record(**common, status="not run", error=f"budget of {self.args.budget:.0f}s spent")
        started = time.monotonic()
        try:
            with open(log_path, "w") as log:
                done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                      timeout=self.args.trainer_timeout, start_new_session=True)
        except subprocess.TimeoutExpired:
            return self.record(**common, status="error", error=f"timed out after {self.args.trainer_timeout:.0f}s")
        wall = round(time.monotonic() - started, 1)
        if done.returncode != 0 or not os.path.exists(report):
            return self.record(**common, status="error", wall_s=wall,
                               error=f"exit {done.returncode}: {tail(log_path)}")
        got = json.loads(open(report).read())
        timed = got["step_ms"][shape.warmup:] or got["step_ms"]
        with open(log_path) as f:
            mfu = table.engine_mfu(f.read().splitlines(), shape.warmup) if engine == "ours" else None
        self.record(**common, status="ok", losses=got["losses"], step_ms=timed,
                    step_ms_median=sorted(timed)[len(timed) // 2], peak_mem_gib=got["peak_mem_gib"],
                    engine_mfu=mfu, wall_s=wall)


def wait(proc: subprocess.Popen | None, seconds: float) -> bool:
    """Whether ``proc`` (None: nothing to wait for) has ended within ``seconds``."""
    try:
        return proc is None or proc.wait(timeout=seconds) is not None
    except subprocess.TimeoutExpired:
        return False


def tail(path: str, lines: int = 1) -> str:
    """The log's last line that says something (a traceback's last line: the exception)."""
    try:
        with open(path, errors="replace") as f:
            text = [line.strip() for line in f.read().splitlines() if line.strip()]
    except OSError:
        return ""
    return " | ".join(text[-lines:])[:300]


def save_trainer_weights(tiny: bool, seq: int, batch: int) -> tuple[str, float]:
    """The Llama's starting weights, saved for the Trainer runs' from_pretrained; its FLOPs per step."""
    from accept_models import build_lm, flops_per_token

    lm = build_lm("llama", tiny)
    folder = tempfile.mkdtemp(prefix="accept-llama-")
    lm.save_pretrained(folder)
    return folder, flops_per_token(lm, seq) * seq * batch


def header(records: dict, outdir: str, rejudged: bool) -> list[str]:
    if rejudged:   # the run's own header (its commit, card, versions) stays: only the verdicts are new
        try:
            with open(os.path.join(outdir, "accept.md")) as f:
                first = [next(f).rstrip("\n") for _ in range(3)]
        except (OSError, StopIteration):
            first = ["# scripts/gpu_accept.py (the run's header is lost: accept.md missing)"]
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        return [first[0] + f", judged again {when} (--report-only)", *first[1:]]
    import torch
    import transformers

    commit = os.environ.get("ACCEPT_COMMIT", "")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                    text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        from importlib.metadata import version
        deepspeed = version("deepspeed")
    except Exception:
        deepspeed = "not installed"
    devices = sorted({r.get("device") for r in records.values() if r.get("device")})
    reused = sorted({r["reused_from"] for r in records.values() if r.get("reused_from")})
    note = ([f"DeepSpeed's cells are not run here: taken from {', '.join(reused)} (the same card; DeepSpeed "
             "unchanged), so their step ratios compare across runs"] if reused else [])
    return [f"# scripts/gpu_accept.py: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
            f"commit {commit or 'unknown (set ACCEPT_COMMIT)'}; card {', '.join(devices) or 'unknown'}; "
            f"torch {torch.__version__}, transformers {transformers.__version__}, deepspeed {deepspeed}", *note]


def deepspeed_cells(paths: list[str], device: str | None) -> dict[tuple[str, str], dict]:
    """The DeepSpeed cells of earlier runs' cells.jsonl files (the last record of a cell wins, later files
    over earlier ones) that ran on ``device``: {(model, variant): record}. An errored or unrun cell is not
    taken, nor one from another card (its step times would not compare)."""
    found: dict[tuple[str, str], dict] = {}
    cards: set[str] = set()
    for path in paths:
        with open(path) as f:
            for line in f:
                record = json.loads(line) if line.strip() else {}
                cards |= {record["device"]} if record.get("event") == "cell" and record.get("device") else set()
                if record.get("event") == "cell" and record.get("engine") == "deepspeed":
                    found[(record["model"], record["variant"])] = dict(record, reused_from=path)
    # Trainer cells recorded before 2026-12-07 16:50 name no card: theirs is the one card the files name
    only = cards.pop() if len(cards) == 1 else None
    return {key: record for key, record in found.items()
            if record.get("status") == "ok" and device is not None and record.get("device", only) == device}


def reuse_deepspeed(run: Run, spec: str) -> set[tuple[str, str]]:
    """``--deepspeed-from``: record the earlier DeepSpeed cells of this run's card as this run's; the cells taken."""
    if not spec:
        return set()
    cells = deepspeed_cells([p for p in spec.split(",") if p], run.card())
    for record in cells.values():
        run.record(**{k: v for k, v in record.items() if k not in ("event", "time")})
    return set(cells)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.outdir, exist_ok=True)
    run = Run(args)
    if args.report_only:
        if not os.path.exists(run.results):
            print(f"gpu_accept.py: --report-only needs {run.results} from an earlier run", file=sys.stderr)
            return 2
        names = [m for m in args.models.split(",") if m]
        return report(run, names, [v for v in args.variants.split(",") if v], not args.no_trainer and "llama" in names)
    open(run.results, "a").close()
    shape = TINY if args.tiny else FULL
    names = [m for m in args.models.split(",") if m]
    variants = [v for v in args.variants.split(",") if v]
    have_deepspeed = importlib.util.find_spec("deepspeed") is not None
    prebuild = None
    if have_deepspeed:   # DeepSpeed's Adam ops compile while plain PyTorch trains
        prebuild = subprocess.Popen([sys.executable, os.path.join(HERE, "accept_worker.py"), "--prebuild"],
                                    stdout=open(os.path.join(args.outdir, "prebuild.log"), "w"),
                                    stderr=subprocess.STDOUT, env=process_env(args.device), start_new_session=True)
    run.run_group("plain", [(m, v) for m in names for v in PLAIN_VARIANTS], "plain")
    wait(prebuild, 60)   # our offload's CPU Adam is timed on a quiet host, if the compile ends soon enough
    for m in names:   # a process per model, as DeepSpeed's: what one engine leaks stays with one model
        run.run_group("ours", [(m, v) for v in variants], f"ours-{m}")
    if prebuild is not None and not wait(prebuild, max(10.0, 300 - (time.monotonic() - run.started))):
        os.killpg(prebuild.pid, signal.SIGKILL)
    reused = reuse_deepspeed(run, args.deepspeed_from)
    for m in names:
        cells = [(m, v) for v in variants if (m, v) not in reused]
        if not cells:
            continue
        if not have_deepspeed:
            for v in variants:
                run.record(model=m, variant=v, engine="deepspeed", status="n/a: deepspeed not installed")
            continue
        if args.device == "cpu" and "zero2_fp16" in variants:
            run.record(model=m, variant="zero2_fp16", engine="deepspeed",
                       status="n/a: DeepSpeed's CPU accelerator has no fp16")
            cells.remove((m, "zero2_fp16"))
        run.run_group("deepspeed", cells, f"deepspeed-{m}")
    if not args.no_trainer and "llama" in names:
        weights, flops = save_trainer_weights(args.tiny, shape.seq, shape.batch)
        config_path = os.path.join(args.outdir, "ds_config_trainer.json")
        with open(config_path, "w") as f:
            json.dump(TRAINER_CONFIG, f, indent=1)
        for engine in ("plain", "ours", "deepspeed"):
            if engine == "deepspeed" and ("llama", "trainer_zero3") in reused:
                continue
            if engine == "deepspeed" and not have_deepspeed:
                run.record(model="llama", variant="trainer_zero3", engine=engine, status="n/a: deepspeed not installed")
                continue
            run.run_trainer(engine, weights, config_path, flops)
    return report(run, names, variants, not args.no_trainer and "llama" in names)


def report(run: Run, names: list[str], variants: list[str], trainer: bool) -> int:
    """The tables from every record in cells.jsonl (the last record of a cell wins), to stdout and accept.md."""
    from launcher.zero.flops.peak import peak_tflops

    records = {}
    for r in run.read(0)[0]:
        if r["event"] == "cell":
            records[(r["model"], r["variant"], r["engine"])] = r
    drifts = {m: table.self_drift(records, m) for m in names}
    devices = [r["device"] for r in records.values() if r.get("device") not in (None, "cpu")]
    peak = peak_tflops(os.environ, devices[0]) if devices else peak_tflops(os.environ, None)
    keys = [(m, v, "plain") for m in names for v in PLAIN_VARIANTS]
    keys += [(m, v, e) for m in names for v in variants for e in ("ours", "deepspeed")]
    if trainer:
        keys += [("llama", "trainer_plain", "plain"), ("llama", "trainer_zero3", "ours"),
                 ("llama", "trainer_zero3", "deepspeed")]
    rows = [table.judge(records, drifts, *key, peak) for key in keys]
    lines = header(records, run.out, run.args.report_only) + [f"peak {peak} TFLOP/s per card (launcher/zero/flops/peak.py)" if peak else
                               "peak unknown here: no MFU column"]
    text = table.markdown(rows, list(drifts.values()), lines)
    with open(os.path.join(run.out, "accept.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(run.out, "rows.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(text, flush=True)
    return 1 if any(table.is_red(r) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
