"""A job switched back from this engine to DeepSpeed 0.19.8 mid-training (issue 41 item 4).

This engine runs tests/dist/workers/switch_worker.py and saves after step 4; ``dslaunch-to-deepspeed``
writes that checkpoint in DeepSpeed's layout for the same or the other world size; a real DeepSpeed
``load_checkpoint``s it and continues to step 8. Every step's loss must be this engine's straight
run's, and DeepSpeed's ``zero_to_fp32`` of the written folder must give this engine's fp32 weights.
Needs a real DeepSpeed in this Python (skipped, saying so, without one); scripts/deepspeed_switch.py
runs every stage, precision and world size the same way.
"""
import importlib.util

import pytest

from scripts.deepspeed_switch import steps_before_growth, switch_out
from tests.helpers.recorded import FP32_TOLERANCE

pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                reason="needs a real DeepSpeed (pip install deepspeed==0.19.8) to load the checkpoint")
BF16_TOLERANCE = 2e-3
FP16_GROWTH_GAP = 0.01
# (stage, precision, saved on, continued on): every stage, both world-size moves, every precision
CASES = [(0, "fp32", 1, 2), (1, "bf16", 2, 1), (2, "fp32", 2, 2), (2, "fp16", 2, 1), (3, "bf16", 2, 1),
         (3, "fp32", 1, 2)]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("stage,precision,saved,continued", CASES,
                         ids=[f"zero{s}-{p}-{a}to{b}" for s, p, a, b in CASES])
def test_deepspeed_continues_this_engines_checkpoint(stage, precision, saved, continued, tmp_path):
    result = switch_out(stage, precision, saved, continued, tmp_path)
    deepspeed = result["deepspeed"]
    assert deepspeed["loaded"]["global_steps"] == 4 and deepspeed["global_steps"] == 8
    assert deepspeed["loaded"]["client_state"] == {"epoch": 3, "note": "switch", "seen": [1, 2, 3]}
    assert sorted(result["gaps"]) == ["4", "5", "6", "7"]
    tolerance = FP32_TOLERANCE if precision == "fp32" else BF16_TOLERANCE
    # fp16: exact until DeepSpeed's first scale growth, which it applies its own way (test_deepspeed_switch.py)
    compared = steps_before_growth(deepspeed) if precision == "fp16" else sorted(result["gaps"])
    assert max(result["gaps"][step] for step in compared) <= tolerance, f"per-step loss gaps {result['gaps']}"
    assert max(result["gaps"].values()) <= max(tolerance, FP16_GROWTH_GAP), f"per-step loss gaps {result['gaps']}"
    if stage > 0:
        assert result["zero_to_fp32_gap"] == 0.0
