"""The dry-run's 3D topology: same rank order as the engine, sizes checked against the hosts."""
import json
import subprocess
import sys

import pytest

from launcher.errors import ConfigError
from launcher.planning.topology import build_layout, check_tensor_groups_within_nodes, sizes_from_sections
from launcher.zero.parallel.topology import topology_for
from tests.helpers.world import REPO


@pytest.mark.parametrize("world, pipe, tensor", [(8, 2, 2), (12, 3, 2), (8, 1, 4), (6, 3, 1), (16, 2, 4)])
def test_planning_and_engine_agree_on_every_group(world, pipe, tensor):
    layout = build_layout(world, pipe, tensor)
    topo = topology_for(world, pipe=pipe, model=tensor)
    assert layout.data == topo.get_dim("data")
    assert layout.groups["tensor"] == topo.get_axis_comm_lists("model")
    assert sorted(layout.groups["data"]) == sorted(topo.get_axis_comm_lists("data"))
    assert sorted(layout.groups["pipe"]) == sorted(topo.get_axis_comm_lists("pipe"))


def test_tensor_group_across_nodes_is_refused():
    layout = build_layout(6, 1, 2)
    host_of = {r: ("a" if r < 3 else "b") for r in range(6)}   # 3 slots per node: group [2, 3] straddles
    with pytest.raises(ConfigError, match=r"\[2, 3\] would span hosts a, b"):
        check_tensor_groups_within_nodes(layout, host_of)
    check_tensor_groups_within_nodes(build_layout(6, 2, 1), host_of)   # no tensor axis: fine


@pytest.mark.parametrize("world, pipe, tensor, match", [(6, 4, 1, "does not divide"), (8, 0, 1, "pipeline.stages"),
                                                       (8, 1, "2", "autotp_size")])
def test_bad_sizes(world, pipe, tensor, match):
    with pytest.raises(ConfigError, match=match):
        build_layout(world, pipe, tensor)


def test_sizes_come_from_deepspeeds_sections():
    assert sizes_from_sections({"stages": 4}, {"autotp_size": 2}) == (4, 2)
    assert sizes_from_sections({"stages": "auto"}, None) == (1, 1)
    assert sizes_from_sections(None, {"autotp_size": 0}) == (1, 1)


def _dry_run(tmp_path, slots, config, *extra):
    (tmp_path / "hosts").write_text("".join(f"node{i} slots={s}\n" for i, s in enumerate(slots)))
    (tmp_path / "ds.json").write_text(json.dumps(config))
    return subprocess.run([sys.executable, "-m", "launcher", "-H", str(tmp_path / "hosts"), "--dry-run", *extra,
                           "--config", str(tmp_path / "ds.json"), "examples/hello_dist.py"],
                          cwd=str(REPO), capture_output=True, text=True, timeout=60)


CONFIG = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "train_batch_size": 16,
          "pipeline": {"stages": 2}, "tensor_parallel": {"autotp_size": 2},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}


def test_dry_run_prints_the_groups_and_their_hosts(tmp_path):
    done = _dry_run(tmp_path, [4, 4], CONFIG)
    assert done.returncode == 0, done.stderr
    assert "topology: pipe 2 x data 2 x tensor 2" in done.stdout
    assert "tensor group ranks [4, 5] on node1" in done.stdout
    assert "pipe   group ranks [0, 4] on node0,node1" in done.stdout
    document = json.loads(_dry_run(tmp_path, [4, 4], CONFIG, "--json").stdout)
    assert document["topology"]["groups"]["data"][0] == {"ranks": [0, 2], "hosts": ["node0"]}


def test_dry_run_rejects_a_layout_that_does_not_fit(tmp_path):
    done = _dry_run(tmp_path, [3, 3], CONFIG)                      # 6 ranks: 2 x 2 does not divide
    assert done.returncode == 2 and "does not divide the world of 6" in done.stderr
    done = _dry_run(tmp_path, [3, 3], {**CONFIG, "pipeline": {"stages": 1}, "train_batch_size": 24})
    assert done.returncode == 2 and "would span hosts node0, node1" in done.stderr


def test_dry_run_rejects_zero_stages_2_and_3_with_a_pipeline(tmp_path):
    for stage in (2, 3):
        done = _dry_run(tmp_path, [4, 4], {**CONFIG, "zero_optimization": {"stage": stage}})
        assert done.returncode == 2 and f"zero_optimization.stage {stage} with pipeline.stages 2" in done.stderr
        assert '"stage": 1' in done.stderr, done.stderr     # the hint
    assert _dry_run(tmp_path, [4, 4], {**CONFIG, "zero_optimization": {"stage": 1}}).returncode == 0
    no_pipe = {**CONFIG, "pipeline": {"stages": 1}, "train_batch_size": 32, "zero_optimization": {"stage": 3}}
    assert _dry_run(tmp_path, [4, 4], no_pipe).returncode == 0     # tensor parallelism alone: stages 0-3
