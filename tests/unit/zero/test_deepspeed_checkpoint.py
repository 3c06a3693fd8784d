"""DeepSpeed 0.19.8 checkpoint folders read and written without DeepSpeed (issue 41 item 4).

The folders in tests/data/deepspeed-0.19.8/switch/ are one run (tests/dist/workers/switch_worker.py)
saved by a real DeepSpeed after 4 steps at ZeRO 0-3, fp32 and bf16, on 1 and 2 ranks
(scripts/record_deepspeed_switch.py). Read here, every fp32 case must give the same weights and Adam
moments whatever its stage and world size, DeepSpeed's own partition maps must be the ones this
reader computes, and what is written back must read back the same.
"""
import json
import shutil

import pytest
import torch

from launcher.zero.checkpoint import deepspeed_layout as layout
from launcher.zero.checkpoint import deepspeed_writer as writer
from launcher.zero.checkpoint.deepspeed_convert import convert, main, open_checkpoint
from launcher.zero.checkpoint.deepspeed_layout import DeepSpeedCheckpointError
from launcher.zero.checkpoint.deepspeed_reader import DeepSpeedCheckpoint, is_deepspeed_checkpoint
from tests.helpers.recorded import DATA

SWITCH = DATA / "switch"
CASES = sorted(p.name for p in SWITCH.iterdir()) if SWITCH.is_dir() else []
NAMES = ["0.weight", "0.bias", "2.weight", "2.bias"]


def reader(case: str) -> DeepSpeedCheckpoint:
    return DeepSpeedCheckpoint(str(SWITCH / case / "global_step4"))


def full_moments(source: DeepSpeedCheckpoint) -> dict:
    metadata = source.metadata()
    gathered = writer.gather(metadata, source.model_states(), source.shard)
    return {name: gathered.moments[name] for name in NAMES}


def test_the_recorded_folders_cover_every_stage_precision_and_world_size():
    expected = [f"zero{s}-{p}-ws{w}" for s in range(4) for p in ("fp32", "bf16", "fp16") for w in (1, 2)]
    assert sorted(CASES) == sorted(expected)
    record = json.loads((DATA / "switch.json").read_text())
    assert all("resumed" in record["cases"][name] for name in expected)


@pytest.mark.parametrize("case", CASES)
def test_every_case_holds_the_same_run(case):
    """One run at every stage and world size: the weights agree to summation order, the Adam
    moments too, and the step is 4 (FusedAdam counts it on a group's last parameter only)."""
    precision = case.split("-")[1]
    # DeepSpeed's stage-0 16-bit optimizer steps its own way (docs/engine/zero.md, Precision): its own reference
    zero0_16bit = case.startswith("zero0-") and precision != "fp32"
    ours, reference = reader(case), reader(f"{'zero0' if zero0_16bit else 'zero1'}-{precision}-ws2")
    for name in NAMES:
        torch.testing.assert_close(ours.full_fp32_params()[name], reference.full_fp32_params()[name],
                                   atol=2e-6 if precision == "fp32" else 1e-2, rtol=0)
    mine, theirs = full_moments(ours), full_moments(reference)
    for name in NAMES:
        torch.testing.assert_close(mine[name]["exp_avg"], theirs[name]["exp_avg"],
                                   atol=1e-5 if precision == "fp32" else 2e-2, rtol=0)
    steps = {float(f["scalars"]["step"]) for r in range(len(ours.pieces)) for f in ours.shard(r)["fragments"]}
    assert steps == ({5.0} if zero0_16bit else {4.0})   # FP16_Optimizer steps once at start


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith(("zero1", "zero2")) and c.endswith("ws2")])
def test_the_partition_map_is_deepspeeds_own(case):
    """DeepSpeed saves each rank's param_slice_mappings (name -> numel, start in the partition)."""
    source = reader(case)
    for rank in range(2):
        saved = layout.load(source._optim_file(rank), "test")["optimizer_state_dict"]["param_slice_mappings"][0]
        theirs = {name: (address.numel, address.start) for name, address in saved.items()}
        assert theirs == {p.name: (p.numel, p.offset) for p in source.pieces[rank]}


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith(("zero0", "zero1", "zero2"))])
def test_the_fp32_masters_round_to_deepspeeds_saved_module(case):
    source = reader(case)
    module = source.states["module"]
    for name in NAMES:
        assert torch.equal(source.full_fp32_params()[name].to(module[name].dtype), module[name])


def test_stage3_module_is_rebuilt_from_the_masters():
    """DeepSpeed saves empty placeholders for stage 3's parameters; the reader gives them whole."""
    source = reader("zero3-bf16-ws2")
    assert source.states["module"]["0.weight"].numel() == 0
    module = source.model_states()["module"]
    assert module["0.weight"].shape == (16, 8) and module["0.weight"].dtype == torch.bfloat16


def test_model_states_carry_the_counters_scheduler_and_deepspeeds_client_state():
    states = reader("zero1-fp32-ws2").model_states()
    assert (states["global_steps"], states["global_samples"], states["skipped_steps"]) == (4, 32, 0)
    assert states["lr_scheduler"] == {"last_batch_iteration": 3}
    assert {k: states["client_state"][k] for k in ("epoch", "note", "seen")} == {"epoch": 3, "note": "switch",
                                                                                "seen": [1, 2, 3]}
    assert "module" not in states["client_state"] and "ds_version" in states["client_state"]   # DeepSpeed's rule
    assert states["param_groups"][0]["lr"] == pytest.approx(0.011) and "params" not in states["param_groups"][0]


def test_a_missing_rank_file_is_an_error_naming_it(tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(SWITCH / "zero2-fp32-ws2", folder)
    (folder / "global_step4" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    # on opening, so that every rank fails alike, even one that would read only rank 0's file
    with pytest.raises(DeepSpeedCheckpointError, match="zero_pp_rank_1_mp_rank_00_optim_states.pt: missing"):
        DeepSpeedCheckpoint(str(folder / "global_step4"))


@pytest.mark.parametrize("case,name", [("zero2-fp32-ws2", "mp_rank_00_model_states.pt"),
                                       ("zero3-fp32-ws2", "zero_pp_rank_0_mp_rank_00_model_states.pt")])
def test_missing_model_states_are_named_not_taken_for_another_format(case, name, tmp_path):
    shutil.copytree(SWITCH / case / "global_step4", tmp_path / "global_step4")
    (tmp_path / "global_step4" / name).unlink()
    assert is_deepspeed_checkpoint(str(tmp_path / "global_step4"))
    with pytest.raises(DeepSpeedCheckpointError, match=f"{name}: missing"):
        DeepSpeedCheckpoint(str(tmp_path / "global_step4"))


def test_a_missing_key_is_an_error_naming_file_and_key(tmp_path):
    folder = tmp_path / "global_step4"
    shutil.copytree(SWITCH / "zero1-fp32-ws1" / "global_step4", folder)
    name = str(folder / layout.optim_states_name(0, False))
    saved = layout.load(name, "test")
    del saved["optimizer_state_dict"]["single_partition_of_fp32_groups"]
    layout.save(saved, name)
    with pytest.raises(DeepSpeedCheckpointError, match="optim_states.pt: key 'single_partition_of_fp32_groups'"):
        DeepSpeedCheckpoint(str(folder)).shard(0)


@pytest.mark.parametrize("folder,what", [("zero", "the universal layout"), ("offloaded_tensors", "NVMe")])
def test_what_cannot_be_continued_is_refused_with_its_reason(folder, what, tmp_path):
    shutil.copytree(SWITCH / "zero2-fp32-ws2" / "global_step4", tmp_path / "global_step4")
    (tmp_path / "global_step4" / folder).mkdir()
    with pytest.raises(DeepSpeedCheckpointError, match=f"mp_rank_00_model_states.pt: a DeepSpeed checkpoint with .*{what}"):
        DeepSpeedCheckpoint(str(tmp_path / "global_step4"))


def test_deepspeed_objects_round_trip_without_deepspeed(tmp_path):
    value = {"scaler": layout.deepspeed_object(layout.DYNAMIC_SCALER, cur_scale=256.0, cur_iter=7),
             "stage": layout.deepspeed_call(layout.ZERO_STAGE_ENUM, 2)}
    layout.save(value, str(tmp_path / "x.pt"))
    back = layout.load(str(tmp_path / "x.pt"), "test")
    assert type(back["scaler"]).deepspeed_path == layout.DYNAMIC_SCALER and back["scaler"].cur_scale == 256.0
    assert layout.plain(back["stage"]) == 2


def test_stage3_pieces_pad_each_parameter_on_the_last_rank():
    pieces = layout.stage3_pieces([("a", 0, 5), ("b", 0, 2)], 2)
    assert [(p.name, p.param_start, p.numel, p.offset) for p in pieces[0]] == [("a", 0, 3, 0), ("b", 0, 1, 3)]
    assert [(p.name, p.param_start, p.numel, p.offset) for p in pieces[1]] == [("a", 3, 2, 0), ("b", 1, 1, 3)]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_what_is_written_reads_back_the_same(stage, world_size, tmp_path):
    """A DeepSpeed checkpoint resharded for another world size and stage: the same weights and moments."""
    source = reader("zero1-fp32-ws2")
    gathered = writer.gather(source.metadata(), source.model_states(), source.shard)
    writer.write(gathered, str(tmp_path), "global_step4", writer.Target(world_size, stage, torch.float32))
    back = DeepSpeedCheckpoint(str(tmp_path / "global_step4"))
    assert back.world_size == world_size and back.stage == stage
    for name in NAMES:
        assert torch.equal(back.full_fp32_params()[name], source.full_fp32_params()[name])
    again = full_moments(back)
    for name, moments in full_moments(source).items():
        assert all(torch.equal(again[name][key], value) for key, value in moments.items())
    assert back.model_states()["client_state"]["note"] == "switch"


def test_dslaunch_to_deepspeed_names_a_missing_latest(tmp_path, capsys):
    assert main([str(tmp_path), str(tmp_path / "out")]) == 2
    assert "no 'latest' file in" in capsys.readouterr().err


def test_convert_defaults_to_the_saved_world_size_stage_and_precision(tmp_path):
    written = convert(SWITCH / "zero3-bf16-ws2", tmp_path / "out")
    assert is_deepspeed_checkpoint(written)
    metadata, _, _, tag = open_checkpoint(str(tmp_path / "out"))
    assert (tag, metadata["world_size"], metadata["stage"], metadata["param_dtype"]) == ("global_step4", 2, 3,
                                                                                          "torch.bfloat16")


@pytest.mark.parametrize("case", ["zero0-fp32-ws2", "zero2-bf16-ws2", "zero3-fp32-ws1"])
def test_zero_to_fp32_of_ours_reads_a_deepspeed_folder(case):
    """deepspeed.utils.zero_to_fp32 (this engine's, under --as-deepspeed) on DeepSpeed's own folder."""
    from launcher.zero.checkpoint.consolidate import get_fp32_state_dict_from_zero_checkpoint

    state = get_fp32_state_dict_from_zero_checkpoint(SWITCH / case)
    assert list(state) == NAMES and all(value.dtype == torch.float32 for value in state.values())
    assert all(torch.equal(state[name], reader(case).full_fp32_params()[name]) for name in NAMES)


def test_deepspeeds_muon_momentum_at_stage_2_is_refused_not_misplaced(tmp_path):
    """DeepSpeed's ZeRO 1-2 Muon momentum spans the whole matrices a rank touches, not its partition."""
    folder = tmp_path / "global_step4"
    shutil.copytree(SWITCH / "zero2-fp32-ws2" / "global_step4", folder)
    name = str(folder / layout.optim_states_name(1, False))
    saved = layout.load(name, "test")
    base = saved["optimizer_state_dict"]["base_optimizer_state"]
    states = base["state"] if isinstance(base, dict) else base
    first = next(iter(states.values())) if isinstance(states, dict) else states[0]
    partition = saved["optimizer_state_dict"]["single_partition_of_fp32_groups"][0]
    first["momentum_buffer"] = torch.zeros(partition.numel() + 3)
    layout.save(saved, name)
    with pytest.raises(DeepSpeedCheckpointError, match="DeepSpeed's Muon momentum") as caught:
        DeepSpeedCheckpoint(str(folder)).shard(1)
    assert "zero_to_fp32.py" in caught.value.hint


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_muon_checkpoint_is_not_written_in_deepspeeds_layout(stage, tmp_path):
    """Writing ours out for DeepSpeed: Muon's momentum has no recorded DeepSpeed layout here, so the
    converter refuses by name and writes nothing, rather than a folder DeepSpeed would misread."""
    source = reader("zero1-fp32-ws2")
    gathered = writer.gather(source.metadata(), source.model_states(), source.shard)
    gathered.states["ds_config"] = {**gathered.states.get("ds_config", {}),
                                    "optimizer": {"type": "Muon", "params": {"lr": 0.02}}}
    with pytest.raises(DeepSpeedCheckpointError, match="optimizer Muon") as caught:
        writer.write(gathered, str(tmp_path), "global_step4", writer.Target(2, stage, torch.float32))
    assert "dslaunch-zero-to-fp32" in caught.value.hint
    assert not (tmp_path / "global_step4").exists() and not (tmp_path / "latest").exists()
