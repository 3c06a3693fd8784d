"""Damaged pipeline checkpoints (issue 42 item 4, the pipeline engine's format): the digests written
at save find a truncated, bit-flipped or missing file at load, named with the file and what is wrong;
load_checkpoint(folder) falls back to the newest intact tag on every stage alike, with one message
for the job (rank 0, though rank 1 found it); a damaged tag asked for by name is a CheckpointDamagedError;
a tag saved before digests loads unverified, said once."""
import re
from pathlib import Path

import pytest

from tests.helpers.damage import by_mode, warnings
from tests.helpers.world import check, run_world

WORKER = Path(__file__).parent / "workers" / "pipe_damage_worker.py"
MODES = ("truncated", "bitflip", "missing", "legacy", "explicit")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pipe-damage")
    ranks = check(run_world(WORKER, 2, str(folder), *MODES, timeout=300))
    return folder, ranks[0].records()[0], [by_mode(r.stderr) for r in ranks]


def test_the_manifest_lists_every_file_of_every_stage(world):
    import json

    folder, _, _ = world
    tag = folder / "truncated" / "global_step1"   # undamaged
    listed = sorted(json.loads((tag / "digests.json").read_text())["files"])
    assert listed == sorted(p.name for p in tag.iterdir() if p.name != "digests.json")
    assert "optim_pipe_00_model_00.pt" in listed and "optim_pipe_01_model_00.pt" in listed


@pytest.mark.parametrize("mode, what", [("truncated", r"optim_pipe_01_model_00\.pt: truncated \(\d+ bytes, \d+ were written\)"),
                                        ("bitflip", r"optim_pipe_01_model_00\.pt: content differs from its sha256 digest"),
                                        ("missing", r"optim_pipe_01_model_00\.pt: missing \(\d+ bytes were written\)")])
def test_a_damaged_latest_is_named_and_every_stage_loads_the_newest_intact_tag(world, mode, what):
    folder, results, stderr = world
    for rank in results:   # both stages: rank 0's layers come from the same tag as rank 1's
        assert rank[mode] == {"loaded": "global_step1", "steps": 1, "weights": "step1"}, rank
    said = warnings(stderr[0][mode])
    assert len(said) == 1, stderr[0][mode]
    assert re.search(f"'global_step2' is damaged: {re.escape(str(folder / mode / 'global_step2'))}/{what}", said[0])
    assert said[0].endswith("loaded 'global_step1', the newest intact checkpoint")
    assert warnings(stderr[1][mode]) == []


def test_a_damaged_tag_asked_for_by_name_is_an_error_naming_the_file_and_nothing_is_loaded(world):
    folder, results, _ = world
    for rank in results:
        result = rank["explicit"]
        assert result["error"] == "CheckpointDamagedError" and result["weights"] == "fresh", result
        assert result["message"].startswith(f"checkpoint 'global_step2' is damaged: {folder / 'explicit' / 'global_step2'}"
                                            "/layer_00-model_00-model_states.pt: truncated (")


def test_a_pipeline_checkpoint_without_digests_loads_unverified_and_says_so_once(world):
    folder, results, stderr = world
    for rank in results:
        assert rank["legacy"] == {"loaded": "global_step2", "steps": 2, "weights": "step2"}, rank
    said = warnings(stderr[0]["legacy"]) + warnings(stderr[1]["legacy"])
    assert said == [f"[zero] rank 0: warning: checkpoint {folder / 'legacy' / 'global_step2'} has no digests.json "
                    "(saved before checkpoints carried digests): loaded without verification"]
