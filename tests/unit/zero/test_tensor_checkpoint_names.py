"""Checkpoints through zero.initialize(mpu=): file names per tensor rank, and the tensor size checked at load."""
import pytest

from launcher.zero.checkpoint import format as fmt
from launcher.zero.checkpoint.save_load import _check_tensor_size
from launcher.zero.errors import CheckpointError


def test_each_tensor_rank_has_its_own_file_names_and_plain_checkpoints_keep_theirs():
    assert fmt.shard_name(1, fmt.tensor_prefix(1, 2)) == "model_01-rank_1_shard.pt"
    assert fmt.shard_name(1, fmt.tensor_prefix(0, 1)) == "rank_1_shard.pt"     # no tensor parallelism
    assert [fmt.metadata_name(m) for m in range(3)] == ["metadata.json", "model_01-metadata.json",
                                                        "model_02-metadata.json"]


def test_loading_at_another_tensor_size_is_refused_with_the_way_round():
    with pytest.raises(CheckpointError, match="tensor-parallel size 2, running with 1") as caught:
        _check_tensor_size("ckpt/global_step2", {"tensor_parallel": {"size": 2}}, 1)
    assert "dslaunch-zero-to-fp32" in caught.value.hint
    with pytest.raises(CheckpointError, match="size 1, running with 4"):
        _check_tensor_size("ckpt/global_step2", {}, 4)
    _check_tensor_size("ckpt/global_step2", {"tensor_parallel": {"size": 2}}, 2)
