"""The 3D example and the bubble benchmark run small through the real launcher (CPU, gloo)."""
import re

import pytest

from tests.helpers.world import REPO, check, run_world


def test_train_gpt_in_3d_learns():
    results = check(run_world(REPO / "examples" / "train_gpt.py", 4, "--pipeline", "2", "--tensor", "2",
                              "--config", str(REPO / "examples" / "configs" / "pipe3d.json"), "--steps", "12",
                              timeout=240))
    text = results[0].stdout
    assert "3D pipe=2 data=1 tensor=2" in text, text
    first, val = (float(v) for v in re.search(r"first loss ([\d.]+) .* val loss ([\d.]+)", text).groups())
    assert val < first - 0.5, text      # it learns (ln 65 = 4.17 at the start)


def test_bench_pipeline_prints_a_bubble_per_schedule():
    results = check(run_world(REPO / "scripts" / "bench_pipeline.py", 2, "--width", "32", "--micro-batch", "4",
                              "--warmup", "1", "--repeats", "1", "--schedules", "1f1b,gpipe", timeout=120))
    records = results[0].records()
    assert [(r["schedule"], r["micro_batches"]) for r in records] == [("1f1b", 4), ("1f1b", 8), ("gpipe", 4), ("gpipe", 8)]
    assert all(0.0 <= r["bubble_fraction"] < 1.0 and r["step_s"] > 0 for r in records)


def test_bench_pipeline_measures_every_schedule_side_by_side():
    """The default run: GPipe, 1F1B and interleaved 1F1B (2 virtual stages) at 4 and 8 micro-batches."""
    results = check(run_world(REPO / "scripts" / "bench_pipeline.py", 2, "--width", "16", "--micro-batch", "2",
                              "--warmup", "1", "--repeats", "1", timeout=120))
    records = results[0].records()
    assert [(r["schedule"], r["micro_batches"], r["virtual_stages"]) for r in records] == [
        ("gpipe", 4, 1), ("gpipe", 8, 1), ("1f1b", 4, 1), ("1f1b", 8, 1), ("interleaved", 4, 2), ("interleaved", 8, 2)]
    assert all(0.0 <= r["bubble_fraction"] < 1.0 and r["step_s"] > 0 for r in records)
    ideal = {(r["schedule"], r["micro_batches"]): r["ideal_bubble_fraction"] for r in records}
    assert ideal[("1f1b", 4)] == 1 / 5 and ideal[("interleaved", 4)] == 1 / 9    # (S-1)/(M+S-1), (S-1)/(VM+S-1)
    assert "bubble measured" in results[0].stdout     # the side-by-side table


@pytest.mark.parametrize("args", [["--schedule", "gpipe"], ["--schedule", "1f1b", "--zero-stage", "1"],
                                  ["--schedule", "interleaved"]])
def test_the_readme_pipeline_example_learns_under_each_schedule(args):
    results = check(run_world(REPO / "examples" / "train_pipeline.py", 4, *args, "--steps", "40", "--width", "16",
                              timeout=180))
    text = results[0].stdout
    assert f"schedule {args[1]}, stages 2, data 2" in text, text
    first, last = (float(v) for v in re.search(r"first loss ([\d.]+), last loss ([\d.]+)", text).groups())
    assert last < first / 2, text
