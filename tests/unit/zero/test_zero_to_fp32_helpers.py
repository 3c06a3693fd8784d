"""``deepspeed.utils.zero_to_fp32``'s file helpers, which Lightning's checkpoint conversion calls (issue 41)."""
import pytest

from launcher.zero.errors import NotSupportedError
from launcher.zero.utils.zero_to_fp32 import get_model_state_file, get_model_state_files, get_optim_files


def test_on_deepspeeds_files_they_answer_as_deepspeed_0_19_8(tmp_path):
    for rank in (0, 2, 10):
        (tmp_path / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"")
        (tmp_path / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt").write_bytes(b"")
    (tmp_path / "mp_rank_00_model_states.pt").write_bytes(b"")
    assert [p.rsplit("/", 1)[1].split("_")[4] for p in get_optim_files(tmp_path)] == ["0", "2", "10"]
    assert len(get_model_state_files(tmp_path)) == 4
    assert get_model_state_file(tmp_path, 2).endswith("/mp_rank_00_model_states.pt")
    assert get_model_state_file(tmp_path, 3).endswith("/zero_pp_rank_0_mp_rank_00_model_states.pt")


def test_a_folder_without_them_is_deepspeeds_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="can't find \\*_optim_states.pt files"):
        get_optim_files(tmp_path)
    with pytest.raises(FileNotFoundError, match="doesn't exist"):
        get_model_state_file(tmp_path / "absent", 1)


def test_one_of_this_engines_checkpoints_says_what_reads_it(tmp_path):
    (tmp_path / "metadata.json").write_text("{}")
    for call in (lambda: get_optim_files(tmp_path), lambda: get_model_state_file(tmp_path, 3)):
        with pytest.raises(NotSupportedError, match="zero_to_fp32.get_(optim_files|model_state_file): .* is a dslaunch checkpoint") as error:
            call()
        assert "get_fp32_state_dict_from_zero_checkpoint" in error.value.hint
