"""DeepSpeed's recorded runs (tests/data/deepspeed-0.19.8, by scripts/record_deepspeed_losses.py), replayed here.

A recorded case is a list of runs (a script and its arguments, ``{out}`` standing for the case's
folder) with the report each run wrote under a real DeepSpeed. ``replay`` runs the same list on 2
CPU ranks under ``dslaunch --as-deepspeed`` and returns this engine's reports in the same order.
"""
from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.world import REPO, check, run_world

DEEPSPEED_VERSION = "0.19.8"
DATA = REPO / "tests" / "data" / f"deepspeed-{DEEPSPEED_VERSION}"
# what a step's loss may differ by from DeepSpeed's in fp32 (issue 30)
FP32_TOLERANCE = 5e-6


def recorded(case: str) -> dict:
    return json.loads((DATA / f"{case}.json").read_text())


def replay(case: str, folder: Path, timeout: float = 280) -> list[dict]:
    """Run a recorded case's runs in order under ``dslaunch --as-deepspeed``; their reports."""
    record = recorded(case)
    reports = []
    for run in record["runs"]:
        args = [a.replace("{out}", str(folder)) for a in run["args"]]
        check(run_world(REPO / args[0], record["world_size"], *args[1:], timeout=timeout, env=record["launch"]["env"],
                        launcher_args=("--as-deepspeed", "--no_local_rank")))
        reports.append(json.loads(Path(args[args.index("--report") + 1]).read_text()))
    return reports


def straight_run(case: str, tmp_path_factory) -> tuple[Path, dict, dict]:
    """One uninterrupted recorded run replayed here: (its folder, our report, DeepSpeed's report)."""
    folder = tmp_path_factory.mktemp(case)
    (ours,) = replay(case, folder)
    return folder, ours, recorded(case)["runs"][0]["report"]


def losses_by_step(report: dict) -> dict[int, float]:
    return {entry["step"]: entry["loss"] for entry in report["steps"]}


def assert_losses_match(ours: dict, theirs: dict, steps=None, tolerance: float = FP32_TOLERANCE) -> None:
    """Every step's loss within ``tolerance`` of DeepSpeed's; the message lists each step's difference."""
    mine, reference = losses_by_step(ours), losses_by_step(theirs)
    steps = sorted(reference) if steps is None else list(steps)
    assert sorted(mine) == sorted(reference), f"steps logged: ours {sorted(mine)}, DeepSpeed's {sorted(reference)}"
    gaps = {step: abs(mine[step] - reference[step]) for step in steps}
    assert max(gaps.values()) <= tolerance, "per-step loss vs DeepSpeed " + ", ".join(
        f"{step}: {mine[step]:.7f} vs {reference[step]:.7f}" for step in steps)
