"""The README's example script as a new user runs it: dslaunch's --config reaches it."""
import os

from tests.helpers.world import REPO, check, run_world

SCRIPT = REPO / "examples" / "train_gpt.py"
ZERO1 = str(REPO / "examples" / "configs" / "zero1.json")


def summary(results):
    return next(line for line in results[0].stdout.splitlines() if line.startswith("[train_gpt] world_size="))


def test_dslaunch_config_is_the_config_the_example_trains_with():
    results = check(run_world(SCRIPT, 2, "--steps", "2", launcher_args=("--config", ZERO1)))
    assert "stage=1" in summary(results)


def test_two_different_configs_are_refused_not_one_silently_ignored():
    results = run_world(SCRIPT, 2, "--steps", "2", "--config", str(REPO / "examples" / "configs" / "zero2.json"),
                        launcher_args=("--config", ZERO1))
    assert results[0].returncode == 2
    assert "two configs: dslaunch --config" in results[0].stderr and "Traceback" not in results[0].stderr
