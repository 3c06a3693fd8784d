"""The 3D example and the bubble benchmark run small through the real launcher (CPU, gloo)."""
import re

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
                              "--warmup", "1", "--repeats", "1", timeout=120))
    records = results[0].records()
    assert [(r["schedule"], r["micro_batches"]) for r in records] == [("1f1b", 4), ("1f1b", 8), ("gpipe", 4), ("gpipe", 8)]
    assert all(0.0 <= r["bubble_fraction"] < 1.0 and r["step_s"] > 0 for r in records)
