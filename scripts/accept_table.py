"""The acceptance run's verdicts and tables (scripts/gpu_accept.py), pure functions over its records.

A record is one run of one (model, variant, engine): its per-step losses, timed step ms, peak
memory. The **bound rule** (``loss_bound``) is the one place that says how far a cell's losses may
stray, from two measurements of the same model in the same run: how far its plain bf16 run drifts
from itself when only the micro-batch split changes (plain vs plain_split: the reduction order,
nothing else), and how far bf16 itself is from fp32 (plain vs plain_fp32: bf16's own error). Two
sound bf16 runs are each about that error from fp32, so they may be up to twice it apart.
"""
from __future__ import annotations

import math
import re
import statistics

# --- the bound rule (adjust here after a GPU run; docs/development/tests.md, "The GPU tier") ---
BOUND_FACTOR = 4.0      # x the model's measured bf16 self-drift (plain vs plain_split)
FP32_FACTOR = 2.0       # x bf16's measured error (plain vs plain_fp32): two bf16 runs, each that far from fp32
BOUND_FLOOR = 2e-3      # never tighter than this (a self-drift of ~0 says nothing)


def loss_bound(self_drift: float | None, recipe_drift: float | None = None,
               fp32_drift: float | None = None) -> float | None:
    """max(BOUND_FACTOR x drift, FP32_FACTOR x fp32_drift, BOUND_FLOOR), drift being the model's bf16
    self-drift, or, where the reference trains another precision recipe (the Trainer's plain run: fp32
    weights under autocast), the larger of that and the recipe's own drift (plain_autocast vs plain).
    ``fp32_drift`` is bf16's own error (plain vs plain_fp32). None: nothing measured."""
    drifts = [d for d in (self_drift, recipe_drift) if _finite(d)]
    if not drifts:
        return None
    fp32 = FP32_FACTOR * fp32_drift if _finite(fp32_drift) else 0.0
    return max(BOUND_FACTOR * max(drifts), fp32, BOUND_FLOOR)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


# DeepSpeed comparisons that cannot decide a status, with the reason the table prints
KNOWN_DEEPSPEED_GAPS = {
    "zero0": "DeepSpeed's stage-0 bf16 steps its own way (docs/engine/zero.md, Precision)",
}
# which plain run each variant's losses and step time are compared with
PLAIN_OF = {"zero2_fp16": "plain_fp16", "trainer_zero3": "trainer_plain", "trainer_plain": "trainer_plain"}


def engine_mfu(lines: list[str], warmup: int) -> float | None:
    """The median ``mfu=`` of our engine's progress lines after the warm-up steps, as a fraction."""
    found = []
    for line in lines:
        step, mfu = re.search(r"\bstep=(\d+)", line), re.search(r"\bmfu=([\d.]+)%", line)
        if step and mfu and int(step.group(1)) > warmup:
            found.append(float(mfu.group(1)) / 100)
    return statistics.median(found) if found else None


def max_gap(a: list[float] | None, b: list[float] | None) -> float | None:
    """The largest |a_i - b_i| over the steps both ran (inf if either has a non-finite loss)."""
    if not a or not b:
        return None
    gaps = [abs(x - y) if math.isfinite(x) and math.isfinite(y) else math.inf for x, y in zip(a, b)]
    return max(gaps)


def self_drift(records: dict, model: str) -> dict:
    """A model's plain runs against its plain bf16 reference: the figures the bound comes from."""
    base = _losses(records, model, "plain", "plain")
    out = {"model": model}
    for name in ("plain_split", "plain_autocast", "plain_fp32", "plain_fp16"):
        out[name] = max_gap(_losses(records, model, name, "plain"), base)
    out["bound"] = loss_bound(out["plain_split"], fp32_drift=out["plain_fp32"])
    return out


def _losses(records: dict, model: str, variant: str, engine: str):
    record = records.get((model, variant, engine))
    return record["losses"] if record and record.get("status") == "ok" else None


def judge(records: dict, drifts: dict, model: str, variant: str, engine: str, peak_tflops: float | None) -> dict:
    """One row of the table: status (ok / error: ... / red: ... / not run), the loss gaps to
    DeepSpeed and to plain against the bound, the step-time ratio to plain, MFU, peak memory."""
    record = records.get((model, variant, engine))
    row = {"model": model, "variant": variant, "engine": engine}
    if record is None:
        return {**row, "status": "not run"}
    if record.get("status") != "ok":
        return {**row, "status": record.get("status", "error"), "reason": record.get("error", "")}
    plain_name = PLAIN_OF.get(variant, "plain")
    plain = records.get((model, plain_name, "plain"))
    drift = drifts.get(model, {})
    bound = (loss_bound(drift.get("plain_split"), drift.get("plain_autocast"), drift.get("plain_fp32"))
             if plain_name == "trainer_plain" else drift.get("bound"))
    row.update(bound=bound, params=record.get("params"), peak_mem_gib=record.get("peak_mem_gib"),
               engine_mfu=record.get("engine_mfu"), step_ms=record.get("step_ms_median"),
               step1=record["losses"][0] if record["losses"] else None)
    is_reference = (variant, engine) == (plain_name, "plain")
    plain_ok = plain is not None and plain.get("status") == "ok" and not is_reference
    row["vs_plain"] = max_gap(record["losses"], plain["losses"]) if plain_ok else None
    if plain_ok and plain.get("step_ms_median"):
        row["time_ratio"] = record["step_ms_median"] / plain["step_ms_median"]
    if peak_tflops and record.get("flops_per_step") and record.get("step_ms_median"):
        row["mfu"] = record["flops_per_step"] / (record["step_ms_median"] / 1e3) / (peak_tflops * 1e12)
    problems = []
    if engine == "ours":   # our engine's cells are judged; plain's and DeepSpeed's rows only fail by erroring
        twin = records.get((model, variant, "deepspeed"))
        if twin and twin.get("status") == "ok":
            row["vs_deepspeed"] = max_gap(record["losses"], twin["losses"])
            known = KNOWN_DEEPSPEED_GAPS.get(variant)
            if known:
                row["note"] = known
            elif bound is not None and row["vs_deepspeed"] > bound:
                problems.append(f"|loss - DeepSpeed| {row['vs_deepspeed']:.2g} > {bound:.2g}")
        else:
            row["note"] = "no DeepSpeed run" + (f": {twin.get('error', twin.get('status'))}" if twin else "")
        if row["vs_plain"] is None:
            problems.append("no plain run to compare with")
        elif bound is not None and row["vs_plain"] > bound:
            problems.append(f"|loss - plain| {row['vs_plain']:.2g} > {bound:.2g}")
    row["status"] = "red: " + "; ".join(problems) if problems else "ok"
    return row


def is_red(row: dict) -> bool:
    """A row that fails the run: any error or red row, and a missing cell (DeepSpeed's rows included:
    a reference that did not run leaves our cell unjudged)."""
    return row["status"] != "ok" and not row["status"].startswith("n/a")


def _fmt(value, spec: str, scale: float = 1.0) -> str:
    return "" if value is None else format(value * scale, spec)


def markdown(rows: list[dict], drifts: list[dict], header: list[str]) -> str:
    """The run's header lines, the self-drift table (where each model's bound comes from), the cells."""
    lines = [*header, "", f"Bound rule: bound = max({BOUND_FACTOR:g} x self-drift, {FP32_FACTOR:g} x plain_fp32, {BOUND_FLOOR:g});"
             " self-drift = max over steps |plain - plain_split| (bf16 weights, fp32 masters; one batch vs two"
             " micro-batches); plain_fp32 = max over steps |plain - plain in fp32| (bf16's own error).",
             "", "| model | plain_split (self-drift) | plain_autocast | plain_fp32 | plain_fp16 | bound |",
             "|---|---|---|---|---|---|"]
    for d in drifts:
        lines.append(f"| {d['model']} | " + " | ".join(_fmt(d.get(k), ".2e") for k in
                     ("plain_split", "plain_autocast", "plain_fp32", "plain_fp16", "bound")) + " |")
    lines += ["", "| model | variant | engine | status | max abs(loss - DeepSpeed) | max abs(loss - plain) | bound "
              "| step ratio to plain | step ms | MFU | engine's mfu= | peak GiB | step-1 loss |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        status = r["status"] + (f" ({r['reason'][:90]})" if r.get("reason") else "")   # all of it: rows.jsonl
        deepspeed = _fmt(r.get("vs_deepspeed"), ".2e") + (f" ({r['note']})" if r.get("note") else "")
        lines.append("| " + " | ".join([
            r["model"], r["variant"], r["engine"], status.replace("|", "/"), deepspeed, _fmt(r.get("vs_plain"), ".2e"),
            _fmt(r.get("bound"), ".1e"), _fmt(r.get("time_ratio"), ".3f"), _fmt(r.get("step_ms"), ".1f"),
            _fmt(r.get("mfu"), ".1f", 100) + ("%" if r.get("mfu") is not None else ""),
            _fmt(r.get("engine_mfu"), ".1f", 100) + ("%" if r.get("engine_mfu") is not None else ""),
            _fmt(r.get("peak_mem_gib"), ".2f"), _fmt(r.get("step1"), ".5f")]) + " |")
    red = [r for r in rows if is_red(r)]
    lines += ["", f"{len(rows) - len(red)} of {len(rows)} rows ok; red or error: "
              + (", ".join(f"{r['model']}/{r['variant']}/{r['engine']}" for r in red) or "none")]
    return "\n".join(lines)
