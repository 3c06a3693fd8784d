"""scripts/bench_engine.py keeps working: its pure helpers, and a real tiny run on the CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from scripts import bench_engine, bench_report
from tests.helpers import gpt as bench_model
from tests.helpers.figures import is_figure, is_figure_or_unmeasured

SCRIPTS = os.path.dirname(os.path.abspath(bench_engine.__file__))


def _ok(variant, tokens_per_s, peak=None):
    return {"variant": variant, "status": "ok", "tokens_per_s": tokens_per_s,
            "peak_mem_gib": peak}


@pytest.mark.parametrize("tokens, peak, meets", [
    (98.0, 10.0, True),     # 0.98x at equal memory
    (96.0, 10.0, False),    # under 0.97x
    (99.0, 10.5, False),    # fast enough but more memory than plain
])
def test_with_ratios_against_first_plain(tokens, peak, meets):
    results = [_ok("plain", 100.0, 10.0), _ok("zero1", tokens, peak), _ok("plain#2", 50.0, 10.0)]
    out = bench_engine.with_ratios(results, {"zero1": 0.97})
    assert out[0]["ratio_vs_plain"] == 1.0
    assert out[1]["ratio_vs_plain"] == pytest.approx(tokens / 100.0)
    assert out[1]["mem_vs_plain"] == pytest.approx(peak / 10.0)
    assert out[1]["meets_target"] is meets
    assert out[2]["ratio_vs_plain"] == 0.5          # repeats compare with the first plain
    assert "meets_target" not in out[0]


def test_with_ratios_without_plain_leaves_ratios_out():
    out = bench_engine.with_ratios([_ok("zero2", 90.0),
                                    {"variant": "zero3", "status": "unavailable"}], {})
    assert all("ratio_vs_plain" not in r for r in out)


def test_label_repeats_and_json_line_parsing():
    assert bench_engine.label_repeats(["plain", "zero1", "plain", "plain"]) == [
        "plain", "zero1", "plain#2", "plain#3"]
    text = 'noise\n{"variant": "plain", "status": "ok"}\n{not json\n{"other": 1}\n'
    assert bench_engine.last_json_line(text) == {"variant": "plain", "status": "ok"}
    assert bench_engine.last_json_line("nothing here") is None


def test_table_keeps_long_repeat_labels_apart_from_their_status():
    timing = {"step_ms_median": 170.0, "step_ms_min": 168.0, "tflops": 220.0}
    results = [dict(_ok("plain", 100.0, 10.0), **timing),
               dict(_ok("zero2_offload_overlap#2", 60.0, 8.0), **timing),
               {"variant": "ds_zero3_offload_overlap#3", "status": "unavailable", "reason": "no deepspeed"}]
    rows = bench_engine.format_table(bench_engine.with_ratios(results, {})).splitlines()
    assert rows[2].split()[:2] == ["zero2_offload_overlap#2", "ok"]
    assert rows[3].split()[:2] == ["ds_zero3_offload_overlap#3", "unavailable"]
    assert len({row.index(row.split()[1]) for row in rows}) == 1   # the status column lines up


def test_model_counts_match_issue_7():
    assert round(bench_model.count_params(bench_model.GPTConfig()) / 1e6) == 406
    model = bench_model.GPT(bench_model.TINY)
    assert sum(p.numel() for p in model.parameters()) == bench_model.count_params(bench_model.TINY)


def test_unknown_variant_is_usage_error(capsys):
    assert bench_engine.main(["--tiny", "--variants", "plain,zero9"]) == 2
    assert "zero9" in capsys.readouterr().err


def test_tiny_run_on_cpu_prints_one_json_line_per_variant():
    script = os.path.join(SCRIPTS, "bench_engine.py")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, also on a machine with a GPU
    proc = subprocess.run([sys.executable, script, "--tiny", "--variants",
                           "plain,fsdp2,zero2,ds_zero2"], capture_output=True, text=True,
                          timeout=240, env=env)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    peak = [r for r in lines if r["variant"] == "matmul_peak"]
    # measured first, for the MFU: a figure or "not measured", however slow the machine is today
    assert len(peak) == 1 and "tflops" in peak[0] and is_figure_or_unmeasured(peak[0]["tflops"]), proc.stderr
    records = [r for r in lines if r["variant"] != "matmul_peak" and "loss_comparison" not in r]
    assert [r["variant"] for r in records] == ["plain", "fsdp2", "zero2", "ds_zero2"], proc.stderr
    assert plain_has_mfu(records[0], peak[0]["tflops"]), (records[0], peak[0])
    plain, fsdp2, zero2, deepspeed = records
    assert plain["status"] == "ok" and plain["ratio_vs_plain"] == 1.0
    assert plain["step_ms_min"] <= plain["step_ms_median"]
    assert is_figure(plain["tokens_per_s"]) and is_figure(plain["tflops"])
    assert fsdp2["status"] == "ok", fsdp2.get("reason")
    # Same seed, same model, same data: every variant starts from the same loss.
    assert fsdp2["loss_first"] == pytest.approx(plain["loss_first"], rel=1e-2)
    # Our engine must never crash the benchmark: it runs, or says why it cannot.
    assert zero2["status"] in ("ok", "unavailable"), zero2.get("reason")
    assert zero2["status"] == "ok" or zero2["reason"]
    assert deepspeed["status"] == "unavailable" and "CUDA" in deepspeed["reason"]
    assert proc.returncode == 0, proc.stderr[-2000:]


def plain_has_mfu(plain, peak_tflops):
    """The record carries ``mfu``: its TFLOP/s over the peak's, or None where no peak was measured."""
    if not peak_tflops:
        return "mfu" in plain and plain["mfu"] is None
    return plain["mfu"] == pytest.approx(plain["tflops"] / peak_tflops, rel=1e-2, abs=1e-6)


@pytest.mark.parametrize("value, decimals, expected", [
    (412.3456, 2, 412.35),        # a GPU's figures round as before
    (0.4512345678, 6, 0.451235),
    (0.0034567, 2, 0.00346),      # a CPU's peak keeps three digits, not 0.0
    (0.000123456, 4, 0.000123),
    (0.0, 2, 0.0),
    (None, 2, None),
])
def test_round_figure_keeps_small_cpu_figures_off_zero(value, decimals, expected):
    assert bench_report.round_figure(value, decimals) == expected


def test_mfu_of_a_tiny_cpu_peak_is_reported_and_printed_without_a_misleading_zero():
    ok = {"variant": "plain", "status": "ok", "tflops": 0.0004, "tokens_per_s": 900.0}
    [row] = bench_report.add_mfu([ok], 0.0031)
    assert row["mfu"] == pytest.approx(0.0004 / 0.0031, rel=1e-3)
    assert bench_report.add_mfu([ok], 0.0)[0]["mfu"] is None     # a peak of 0 measures nothing
    assert bench_report.add_mfu([ok], None)[0]["mfu"] is None
    assert bench_report.format_mfu(0.41234) == "MFU 41.2%"
    assert bench_report.format_mfu(0.0000421) == "MFU 0.00421%"
    assert bench_report.format_mfu(None) == "MFU not measured"
    assert bench_engine.format_tflops(412.34) == "412.3" and bench_engine.format_tflops(0.00346) == "0.00346"


def test_summarize_repeats_takes_medians_of_runs_and_ratios_to_plains_median():
    runs = [_ok("plain", 100.0), _ok("zero3", 90.0), _ok("plain#2", 120.0), _ok("zero3#2", 60.0),
            _ok("plain#3", 110.0), _ok("zero3#3", 99.0)]
    rows = {r["variant"]: r for r in bench_engine.summarize_repeats(runs, {"zero3": 0.97})}
    assert rows["plain"]["tokens_per_s_median"] == 110.0 and rows["plain"]["runs_ok"] == 3
    assert rows["zero3"]["tokens_per_s_median"] == 90.0
    assert rows["zero3"]["ratio_vs_plain"] == round(90 / 110, 4)
    assert rows["zero3"]["spread"] == round((99 - 60) / 90, 4) and rows["zero3"]["meets_target"] is False


def test_the_inf_nan_trace_cost_is_the_traced_variants_slowdown_against_its_trace_off_twin():
    from scripts.bench_variants import TRACE_OFF_TWIN, VARIANTS

    assert TRACE_OFF_TWIN["zero2_nantrace_off"] == "zero2_nantrace" and "zero2_nantrace_off" in VARIANTS
    rows = bench_report.add_trace_cost([_ok("zero2_nantrace", 98.0), _ok("zero2_nantrace_off", 100.0),
                                        _ok("zero1", 50.0)], TRACE_OFF_TWIN)
    assert rows[0]["trace_cost"] == 0.02 and "trace_cost" not in rows[1] and "trace_cost" not in rows[2]
    assert bench_report.format_trace_costs(rows) == \
        "[trace] zero2_nantrace: the inf/NaN trace costs 2.00% of a step (tokens/s vs zero2_nantrace_off)"
    assert bench_report.trace_costs({"zero2_nantrace": 98.0}, TRACE_OFF_TWIN) == {}   # no twin ran: no figure
