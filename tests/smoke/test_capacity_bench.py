"""scripts/bench_capacity.py: its search logic (pure) and one tiny CPU run of the real script."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.figures import is_figure

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import bench_capacity as cap  # noqa: E402

GIB = 2**30


def probe(layers, gpu_gib, host_gib):
    return {"layers": layers, "peak_gpu_bytes": gpu_gib * GIB, "peak_host_bytes": host_gib * GIB}


def test_prediction_takes_the_smaller_of_the_gpu_and_host_lines():
    probes = [probe(2, 12, 1), probe(6, 24, 1.2)]          # 3 GiB of GPU a layer, host barely grows
    guess = cap.predict(probes, 140 * GIB, 125 * GIB, 1.0, max_layers=160)
    assert guess["layers_by_gpu"] == (140 - 6) // 3 and guess["bound"] == "GPU memory"
    offload = [probe(2, 3, 17), probe(6, 5, 33)]            # 4 GiB of host a layer
    guess = cap.predict(offload, 140 * GIB, 125 * GIB, 1.0, max_layers=160)
    assert guess["layers"] == (125 - 9) // 4 and guess["bound"] == "host memory"


def test_memory_that_does_not_grow_does_not_bound():
    probes = [probe(2, 12, 1.19), probe(6, 24, 1.16)]       # host RSS noise: a smaller reading
    assert cap.predict(probes, 140 * GIB, 125 * GIB, 1.0, max_layers=160)["layers_by_host"] == 160


@pytest.mark.parametrize("tried, expected", [
    ([("ok", 20)], 22),                                      # fits: grow by 10%
    ([("oom", 20)], 18),                                     # does not: shrink by 10%
    ([("ok", 20), ("oom", 30)], 25),                         # bracketed: bisect
    ([("ok", 20), ("oom", 21)], 20),                         # edge found: the loop stops (20 tried)
    ([("ok", 26), ("not started", 27)], 26),
])
def test_next_size_bisects_between_fit_and_failure(tried, expected):
    assert cap.next_layers([{"status": s, "layers": n} for s, n in tried]) == expected


def test_tiny_run_on_cpu_reports_the_largest_size_per_variant():
    out = subprocess.run([sys.executable, str(SCRIPTS / "bench_capacity.py"), "--tiny", "--variants", "plain",
                          "--probes", "1,2"], capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=180, check=True)
    summary = [json.loads(line) for line in out.stdout.splitlines() if '"summary"' in line]
    assert [s["variant"] for s in summary] == ["plain"]
    assert summary[0]["largest_ok"]["layers"] >= 2 and is_figure(summary[0]["largest_ok"]["tokens_per_s"])


def test_marginal_bytes_per_param_cancel_what_does_not_grow():
    probes = [{"layers": 2, "params": 100, "offload_state_bytes": 96 * 2**20 + 600},
              {"layers": 6, "params": 300, "offload_state_bytes": 96 * 2**20 + 1800}]
    assert cap.marginal_per_param(probes, "offload_state_bytes") == 6.0   # the feed's slots cancel out
    assert cap.marginal_per_param([{"layers": 1, "params": 1}, {"layers": 2, "params": 2}], "x") is None


def test_bf16_states_bring_the_offloaded_states_to_6_bytes_a_parameter():
    """Issue 43 item 3: stage 3 with optimizer offload keeps fp32 masters and moments (12 bytes a
    parameter) or, with bf16 master weights and optimizer states, bf16 ones (6); counted from the
    engine's tensors, so this CPU run gives the figure a GPU host holds for them."""
    out = subprocess.run([sys.executable, str(SCRIPTS / "bench_capacity.py"), "--tiny", "--variants",
                          "zero3_offload_optimizer,zero3_offload_optimizer_bf16", "--probes", "1,2", "--tries", "1"],
                         capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300,
                         check=True)
    summary = {s["variant"]: s for s in map(json.loads, (x for x in out.stdout.splitlines() if '"summary"' in x))}
    assert summary["zero3_offload_optimizer"]["offload_state_bytes_per_param_marginal"] == 12.0
    assert summary["zero3_offload_optimizer_bf16"]["offload_state_bytes_per_param_marginal"] == 6.0
    assert "offloaded states 6.0" in out.stderr
