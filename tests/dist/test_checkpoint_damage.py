"""Damaged checkpoints (issue 42 item 4): a file truncated, bit-flipped or missing is found at load
by the digests written at save, named with the file and what is wrong; load_checkpoint(folder)
falls back to the newest intact tag with one message for the job (rank 0), a tag asked for by name
is a CheckpointDamagedError, a checkpoint without digests loads unverified, said once; under
--max_restarts the job resumes from the intact tag."""
import re
from pathlib import Path

import pytest

from tests.helpers.damage import by_mode, warnings
from tests.helpers.world import check, run_world

WORKER = Path(__file__).parent / "workers" / "ckpt_damage_worker.py"
MODES = ("truncated", "bitflip", "missing", "legacy", "explicit")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One 2-rank world runs every damage (a process start per mode would cost ~10 s each on 2 cores)."""
    folder = tmp_path_factory.mktemp("damage")
    ranks = check(run_world(WORKER, 2, str(folder), *MODES, timeout=300))
    return folder, ranks[0].records()[0], [by_mode(r.stderr) for r in ranks]


@pytest.mark.parametrize("mode, what", [("truncated", r"rank_1_shard\.pt: truncated \(\d+ bytes, \d+ were written\)"),
                                        ("bitflip", r"rank_1_shard\.pt: content differs from its sha256 digest"),
                                        ("missing", r"rank_1_shard\.pt: missing \(\d+ bytes were written\)")])
def test_a_damaged_latest_is_named_and_the_newest_intact_tag_is_loaded(world, mode, what):
    folder, results, stderr = world
    assert results[mode] == {"loaded": "global_step1", "steps": 1, "weights": "step1"}
    said = warnings(stderr[0][mode])
    assert len(said) == 1, stderr[0][mode]
    assert re.search(f"'global_step2' is damaged: {re.escape(str(folder / mode / 'global_step2'))}/{what}", said[0])
    assert said[0].endswith("loaded 'global_step1', the newest intact checkpoint")
    assert warnings(stderr[1][mode]) == []   # one message for the job: rank 1, which found it, says nothing


def test_a_checkpoint_without_digests_loads_unverified_and_says_so_once(world):
    folder, results, stderr = world
    assert results["legacy"] == {"loaded": "global_step2", "steps": 2, "weights": "step2"}
    said = warnings(stderr[0]["legacy"]) + warnings(stderr[1]["legacy"])
    assert said == [f"[zero] rank 0: warning: checkpoint {folder / 'legacy' / 'global_step2'} has no digests.json "
                    "(saved before checkpoints carried digests): loaded without verification"]


def test_a_damaged_tag_asked_for_by_name_is_an_error_naming_the_file_and_nothing_is_loaded(world):
    folder, results, stderr = world
    result = results["explicit"]
    assert result["error"] == "CheckpointDamagedError"
    assert result["message"].startswith(f"checkpoint 'global_step2' is damaged: "
                                        f"{folder / 'explicit' / 'global_step2' / 'model_states.pt'}: truncated (")
    assert result["weights"] == "other"   # the fresh engine's own: no fallback
    assert warnings(stderr[0]["explicit"]) == []


def test_a_job_restarted_after_a_damaged_save_resumes_from_the_newest_intact_tag(tmp_path):
    folder = tmp_path / "ckpt"
    ranks = run_world(WORKER, 2, str(folder), "restart", timeout=240,
                      launcher_args=("--no_local_rank", "--max_restarts", "1"))
    out, err = ranks[0].stdout, ranks[0].stderr
    assert ranks[0].returncode == 0, err
    assert "TRY 0 FROM None AT 0" in out and "TRY 1 FROM global_step2 AT 2" in out, out
    assert "DONE 6" in out
    said = [line for line in err.splitlines() if "warning:" in line and "no 'latest' file" not in line]
    assert len(said) == 1 and "'global_step4' is damaged: " in said[0] and "rank_1_shard.pt: truncated" in said[0]
    assert said[0].endswith("loaded 'global_step2', the newest intact checkpoint")
    assert (folder / "latest").read_text() == "global_step6"


def test_consolidation_names_a_bit_flipped_shard_instead_of_returning_wrong_weights(world):
    from launcher import zero
    from launcher.zero.errors import CheckpointDamagedError

    folder = world[0] / "bitflip"
    with pytest.raises(CheckpointDamagedError, match=r"global_step2/rank_1_shard\.pt: content differs"):
        zero.get_fp32_state_dict_from_zero_checkpoint(folder, tag="global_step2")
    assert set(zero.get_fp32_state_dict_from_zero_checkpoint(folder, tag="global_step1")) == \
        {"0.weight", "0.bias", "2.weight", "2.bias"}
