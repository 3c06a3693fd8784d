"""save_checkpoint / load_checkpoint with no folder, on 2 ranks (issue 41).

DeepSpeed 0.19.8 (engine.save_checkpoint) raises ``ValueError("save_dir must be a non-empty string,
got ''")`` for ``""`` and None before any collective; ``load_checkpoint("")`` reads ``latest`` in the
working folder (``os.path.join("", "latest")``) and ``load_checkpoint(None)`` fails in os.path.join
with a TypeError. Here every rank raises the same CheckpointPathError (a ValueError and a
TypeError) for a save, even when only one rank lacks the folder, and the ranks stay in step.
"""
import pytest

from launcher.zero.errors import CheckpointPathError
from tests.helpers.world import REPO, check, run_world

WORKER = REPO / "tests" / "dist" / "workers" / "ckpt_path_worker.py"


@pytest.mark.timeout(150)   # a rank raising alone would leave its peer waiting in a collective
@pytest.mark.parametrize("stage", [1, 3])
def test_a_missing_folder_fails_the_save_on_every_rank_without_a_hang(stage, tmp_path):
    results = check(run_world(WORKER, 2, str(stage), str(tmp_path), timeout=120))
    by_rank = [r.records() for r in results]
    for rank, records in enumerate(by_rank):
        save_empty, save_none, save_mixed, load_empty, load_none, barrier = records
        for record, given in ((save_empty, "''"), (save_none, "None"), (save_mixed, "''")):
            assert record["error"] == "CheckpointPathError", (rank, record)
            assert {"ValueError", "TypeError"} <= set(record["bases"])
            assert record["message"].startswith(f"save_checkpoint: save_dir must be a non-empty folder path, got {given}")
            assert "same on every rank" in record["hint"]
        assert "(rank 1)" in save_mixed["message"], save_mixed   # rank 0 had a folder; it fails too, naming rank 1
        assert load_empty["error"] is None and load_empty["returned"] == "(None, None)"   # no 'latest' here
        assert load_none["error"] == "CheckpointPathError" and "load_dir must be a non-empty folder path" in \
            load_none["message"]
        assert barrier["call"] == "barrier"
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing written anywhere"


def test_the_error_is_caught_as_deepspeeds_would_be():
    assert issubclass(CheckpointPathError, ValueError) and issubclass(CheckpointPathError, TypeError)
