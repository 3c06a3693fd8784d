"""DeepSpeed 0.19.8 names scripts import that were missing (issue 41 item 2), each doing what
DeepSpeed's does. Reached here by the porting rule (``deepspeed.X`` is ``launcher.zero.X``); the
shim's table must answer each path too (the last test)."""
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from launcher import zero
from launcher.zero.errors import ConfigError, NotSupportedError

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# ---- deepspeed.DeepSpeedConfigError ------------------------------------------------------------
def test_deepspeed_config_error_catches_this_engines_config_errors():
    from launcher.zero.runtime.config import DeepSpeedConfigError

    assert DeepSpeedConfigError is zero.DeepSpeedConfigError and issubclass(ConfigError, DeepSpeedConfigError)
    with pytest.raises(zero.DeepSpeedConfigError):
        zero.load_config({"train_batch_size": 1, "zero_optimization": {"stage": 7}})
    with pytest.raises(zero.DeepSpeedConfigError, match="raised by a script"):   # scripts raise it themselves
        raise zero.DeepSpeedConfigError("raised by a script")


# ---- deepspeed.OnDevice --------------------------------------------------------------------------
def test_on_device_builds_modules_on_that_device_in_that_dtype():
    with zero.OnDevice(dtype=torch.bfloat16, device="meta"):
        big = torch.nn.Linear(4, 4)
        steps = torch.arange(3)
    assert big.weight.device.type == "meta" and big.weight.dtype == torch.bfloat16
    assert steps.dtype == torch.int64                       # only floating tensors take the dtype
    assert torch.get_default_dtype() == torch.float32 and torch.empty(1).device.type == "cpu"
    with zero.OnDevice(dtype=torch.float16, device="cpu", enabled=False):
        plain = torch.nn.Linear(2, 2)
    assert plain.weight.dtype == torch.float32


# ---- deepspeed.zero.TiledLinear --------------------------------------------------------------------
@pytest.mark.parametrize("in_splits, out_splits", [(1, 1), (3, 2), (2, 5)])
def test_tiled_linear_computes_the_linear_it_was_copied_from(in_splits, out_splits):
    torch.manual_seed(0)
    linear = torch.nn.Linear(7, 5)
    tiled = zero.zero.TiledLinear(7, 5, in_splits=in_splits, out_splits=out_splits, init_linear=linear)
    x = torch.randn(3, 7)
    assert torch.allclose(tiled(x), linear(x), atol=1e-6)
    assert len(tiled.linears) == out_splits and all(len(row) == in_splits for row in tiled.linears)
    assert tiled.out_parts[-1] == 5 and tiled.in_parts[-1] == 7


def test_tiled_linear_takes_split_inputs_and_can_leave_the_outputs_split():
    torch.manual_seed(0)
    linear = torch.nn.Linear(6, 4)
    tiled = zero.zero.TiledLinear(6, 4, in_splits=2, out_splits=2, input_is_already_split=True,
                                  combine_out_splits=False, init_linear=linear)
    x = torch.randn(2, 6)
    parts = tiled([x[:, :3], x[:, 3:]])
    assert torch.allclose(torch.cat(parts, dim=-1), linear(x), atol=1e-6)


def test_tiled_linear_refuses_more_splits_than_features():
    with pytest.raises(RuntimeError, match="in splits must be in range"):
        zero.zero.TiledLinear(3, 4, in_splits=4)


class ReturnsBias(torch.nn.Linear):
    """Megatron's layers return their bias for the next op to add (what TiledLinearReturnBias tiles)."""

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight), self.bias


def test_tiled_linear_return_bias_stacks_the_tiles_biases():
    torch.manual_seed(0)
    linear = torch.nn.Linear(6, 4)
    tiled = zero.zero.TiledLinearReturnBias(6, 4, in_splits=2, out_splits=2, linear_cls=ReturnsBias,
                                            init_linear=linear)
    x = torch.randn(2, 6)
    out, bias = tiled(x)
    assert torch.allclose(out + bias, linear(x), atol=1e-6)


def test_tiled_linear_return_bias_trains_at_stage_3_like_a_linear():
    """Its tiles hand their bias parameters on as outputs: stage 3 must gather them (the returned
    parameter case of test_deepspeed_calls.py)."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(6, 4)
    tiled = zero.zero.TiledLinearReturnBias(6, 4, in_splits=2, out_splits=2, linear_cls=ReturnsBias,
                                            init_linear=linear)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.1}}}
    engine, *_ = zero.initialize(model=tiled, config=config)
    reference = torch.optim.AdamW(linear.parameters(), lr=0.1, weight_decay=0.0)
    x = torch.randn(3, 2, 6, generator=torch.Generator().manual_seed(1))
    for step in range(3):
        out, bias = engine(x[step])
        loss = (out + bias).pow(2).mean()
        engine.backward(loss)
        engine.step()
        expected = linear(x[step]).pow(2).mean()
        expected.backward()
        reference.step()
        reference.zero_grad()
        assert abs(loss.item() - expected.item()) < 1e-5


# ---- deepspeed.zero.unwrap_model_for_generation ----------------------------------------------------
def stage3_engine():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3,
                                                                          "stage3_param_persistence_threshold": 0},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.1}}}
    engine, *_ = zero.initialize(model=model, config=config)
    return engine


def test_unwrap_model_for_generation_keeps_stage_3_weights_whole_for_the_block():
    """DeepSpeed gathers every parameter once and removes stage 3's hooks for the block, so each
    generation step runs on whole weights without gathering again; it yields the engine."""
    engine = stage3_engine()
    first = engine.module[0].weight
    x = torch.randn(2, 4)
    with torch.no_grad():
        before = engine(x)
    assert first.numel() == 0
    with zero.zero.unwrap_model_for_generation(engine) as unwrapped:
        assert unwrapped is engine
        with torch.no_grad():
            for _ in range(2):   # the weights stay whole from one forward to the next
                assert torch.allclose(unwrapped(x), before)
                assert tuple(first.shape) == (8, 4)
    assert first.numel() == 0
    loss = engine(x).pow(2).mean()   # training goes on with the hooks back
    engine.backward(loss)
    engine.step()
    with torch.no_grad():
        assert not torch.allclose(engine(x), before)


def test_unwrap_model_for_generation_below_stage_3_yields_the_engine():
    engine, *_ = zero.initialize(model=torch.nn.Linear(2, 2), config={"train_batch_size": 1,
                                                                     "optimizer": {"type": "AdamW"}})
    with zero.zero.unwrap_model_for_generation(engine) as unwrapped:
        assert unwrapped is engine


# ---- deepspeed.accelerator, deepspeed.git_version_info -------------------------------------------
def test_the_current_accelerator_is_supported():
    from launcher.zero.accelerator import is_current_accelerator_supported

    assert is_current_accelerator_supported() is True


def test_git_version_info_names_the_deepspeed_release_matched():
    from launcher.zero import git_version_info

    assert git_version_info.version == zero.__version__ == "0.19.8"
    assert isinstance(git_version_info.git_hash, str) and isinstance(git_version_info.git_branch, str)
    assert isinstance(git_version_info.installed_ops, dict) and not any(git_version_info.installed_ops.values())
    assert git_version_info.torch_info["version"] == "0.0"   # DeepSpeed's "detect at run time" sentinel
    assert (zero.version, zero.git_hash, zero.git_branch) == (git_version_info.version, git_version_info.git_hash,
                                                              git_version_info.git_branch)


# ---- deepspeed.runtime.lr_schedules' config-key constants --------------------------------------------
LR_SCHEDULE_CONSTANTS = {   # DeepSpeed 0.19.8's runtime/lr_schedules.py, lines 18-58
    "LR_SCHEDULE": "lr_schedule", "LR_RANGE_TEST": "LRRangeTest", "ONE_CYCLE": "OneCycle",
    "WARMUP_LR": "WarmupLR", "WARMUP_DECAY_LR": "WarmupDecayLR", "WARMUP_COSINE_LR": "WarmupCosineLR",
    "LR_RANGE_TEST_MIN_LR": "lr_range_test_min_lr", "LR_RANGE_TEST_STEP_RATE": "lr_range_test_step_rate",
    "LR_RANGE_TEST_STEP_SIZE": "lr_range_test_step_size", "LR_RANGE_TEST_STAIRCASE": "lr_range_test_staircase",
    "EDGE_VALUE": "edge_value", "MID_VALUE": "mid_value", "CYCLE_FIRST_STEP_SIZE": "cycle_first_step_size",
    "CYCLE_FIRST_STAIR_COUNT": "cycle_first_stair_count", "CYCLE_SECOND_STEP_SIZE": "cycle_second_step_size",
    "CYCLE_SECOND_STAIR_COUNT": "cycle_second_stair_count", "DECAY_STEP_SIZE": "decay_step_size",
    "CYCLE_MIN_LR": "cycle_min_lr", "CYCLE_MAX_LR": "cycle_max_lr", "DECAY_LR_RATE": "decay_lr_rate",
    "CYCLE_MIN_MOM": "cycle_min_mom", "CYCLE_MAX_MOM": "cycle_max_mom", "DECAY_MOM_RATE": "decay_mom_rate",
    "WARMUP_MIN_LR": "warmup_min_lr", "WARMUP_MAX_LR": "warmup_max_lr", "WARMUP_NUM_STEPS": "warmup_num_steps",
    "WARMUP_TYPE": "warmup_type", "WARMUP_LOG_RATE": "log", "WARMUP_LINEAR_RATE": "linear",
    "WARMUP_MIN_RATIO": "warmup_min_ratio", "COS_MIN_RATIO": "cos_min_ratio", "TOTAL_NUM_STEPS": "total_num_steps",
}


def test_lr_schedules_has_deepspeeds_config_key_constants():
    from launcher.zero.runtime import lr_schedules

    assert {name: getattr(lr_schedules, name, None) for name in LR_SCHEDULE_CONSTANTS} == LR_SCHEDULE_CONSTANTS
    assert lr_schedules.VALID_LR_SCHEDULES == ["LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR",
                                               "WarmupCosineLR"]


def test_the_constants_name_the_schedulers_own_arguments():
    """A config written with the constants builds the scheduler (the names are its keyword arguments)."""
    from launcher.zero.runtime import lr_schedules as ls

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = ls.WarmupLR(optimizer, **{ls.WARMUP_MIN_LR: 0.0, ls.WARMUP_MAX_LR: 0.1, ls.WARMUP_NUM_STEPS: 4,
                                          ls.WARMUP_TYPE: ls.WARMUP_LINEAR_RATE})
    for _ in range(3):
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 2 / 4)


# ---- deepspeed.runtime.zero.config ---------------------------------------------------------------------
def test_zero_stage_enum_and_the_zero_config_type():
    from launcher.zero.zero.config import DeepSpeedZeroConfig, ZeroStageEnum

    assert [int(s) for s in ZeroStageEnum] == [0, 1, 2, 3]
    assert ZeroStageEnum.max_stage is ZeroStageEnum.weights and ZeroStageEnum(2) is ZeroStageEnum.gradients
    assert ZeroStageEnum.gradients == 2 and isinstance(ZeroStageEnum.weights, int)
    loaded = zero.load_config({"train_batch_size": 1, "zero_optimization": {"stage": 2}})
    assert isinstance(loaded.zero_optimization, DeepSpeedZeroConfig) and loaded.zero_optimization.stage == 2
    assert DeepSpeedZeroConfig().stage == 0


# ---- deepspeed.runtime.fp16 (loss scalers), deepspeed.runtime.bf16_optimizer ---------------------------
OVERFLOWS = [True, True, False, True, False, False, False, False, True, True, True]


@pytest.mark.parametrize("consecutive, trace", [
    (False, [65536, 32768, 32768, 16384, 16384, 16384, 16384, 32768, 32768, 16384, 8192]),
    (True, [65536, 32768, 32768, 32768, 32768, 32768, 32768, 65536, 65536, 32768, 16384]),
])
def test_dynamic_loss_scaler_follows_deepspeeds_trace(consecutive, trace):
    """DeepSpeed 0.19.8's DynamicLossScaler on W=3, hysteresis 2 (the reference's ref_values.json)."""
    from launcher.zero.runtime.fp16.loss_scaler import DynamicLossScaler

    scaler = DynamicLossScaler(init_scale=65536, scale_window=3, min_scale=1, delayed_shift=2,
                               consecutive_hysteresis=consecutive)
    seen = []
    for overflow in OVERFLOWS:
        scaler.update_scale(overflow)
        seen.append(scaler.cur_scale)
    assert seen == trace and scaler.loss_scale == trace[-1] and scaler.cur_iter == len(OVERFLOWS)


def test_dynamic_loss_scaler_stops_at_the_minimum_as_deepspeeds():
    from launcher.zero.runtime.fp16.loss_scaler import DynamicLossScaler

    scaler = DynamicLossScaler(init_scale=4, scale_window=1000, min_scale=1, delayed_shift=1,
                               consecutive_hysteresis=False)
    scaler.update_scale(True)
    scaler.update_scale(True)
    with pytest.raises(Exception, match="Current loss scale already at minimum - cannot decrease scale anymore"):
        scaler.update_scale(True)


def test_the_static_scaler_and_the_factory():
    from launcher.zero.runtime.fp16 import loss_scaler as ls

    static = ls.LossScaler(scale=128)
    loss = torch.tensor(2.0, requires_grad=True)
    assert static.scale_loss(loss).item() == 256.0 and not static.dynamic and static.has_overflow([]) is False
    static.update_scale(True)
    assert static.loss_scale == 128
    args = {ls.INITIAL_LOSS_SCALE: 2 ** 16, ls.SCALE_WINDOW: 1000, ls.MIN_LOSS_SCALE: 1, ls.DELAYED_SHIFT: 2,
            ls.CONSECUTIVE_HYSTERESIS: False}
    assert isinstance(ls.CreateLossScaler(torch.float16, 0, True, args), ls.DynamicLossScaler)
    assert ls.CreateLossScaler(torch.bfloat16, 0, True, args).loss_scale == 1.0
    assert ls.CreateLossScaler(torch.float16, 8, False, None).loss_scale == 8
    assert ls.to_python_float(torch.tensor([3.5])) == 3.5


def test_a_scaler_pickled_and_loaded_keeps_its_state():
    """DeepSpeed checkpoints pickle the scaler object; Trainer forks list the classes in
    torch.serialization.add_safe_globals."""
    from launcher.zero.runtime.fp16.loss_scaler import DynamicLossScaler

    scaler = DynamicLossScaler(init_scale=1024, scale_window=2, min_scale=1, delayed_shift=2,
                               consecutive_hysteresis=False)
    for overflow in (True, True, False):
        scaler.update_scale(overflow)
    again = pickle.loads(pickle.dumps(scaler))
    assert vars(again) == vars(scaler)
    again.update_scale(False)
    scaler.update_scale(False)
    assert again.cur_scale == scaler.cur_scale
    assert json.loads(repr(again))["cur_scale"] == scaler.cur_scale   # DeepSpeedConfigObject's repr


def test_the_16_bit_optimizer_wrapper_types_import_and_are_not_what_initialize_returns():
    """FP16_Optimizer / FP16_UnfusedOptimizer / BF16_Optimizer: types scripts test with isinstance;
    this engine's optimizer is its ZeRO optimizer at every stage, so the checks are False."""
    from launcher.zero.runtime.bf16_optimizer import BF16_Optimizer
    from launcher.zero.runtime.fp16.fused_optimizer import FP16_Optimizer
    from launcher.zero.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    engine, optimizer, *_ = zero.initialize(model=torch.nn.Linear(2, 2), config={
        "train_batch_size": 1, "bf16": {"enabled": True}, "optimizer": {"type": "AdamW"}})
    assert not isinstance(optimizer, (BF16_Optimizer, FP16_Optimizer, FP16_UnfusedOptimizer))
    with pytest.raises(NotSupportedError, match="BF16_Optimizer"):
        BF16_Optimizer(torch.optim.SGD(engine.module.parameters(), lr=0.1))


# ---- deepspeed.runtime.config_utils ---------------------------------------------------------------
def test_config_utils_helpers():
    from launcher.zero.runtime import config_utils as cu

    params = {"a": 1}
    assert cu.get_scalar_param(params, "a", 0) == 1 and cu.get_scalar_param(params, "b", 5) == 5
    assert cu.get_list_param(params, "c", [1]) == [1] and cu.get_dict_param(params, "d", {}) == {}
    with pytest.raises(ValueError, match="Duplicate keys in DeepSpeed config: \\['x'\\]"):
        json.loads('{"x": 1, "x": 2}', object_pairs_hook=cu.dict_raise_error_on_duplicate_keys)
    assert repr(cu.pp_int(100000)) == "100,000" and repr(cu.pp_int(5, "five")) == "five"
    assert json.dumps({"n": 123456}, cls=cu.ScientificNotationEncoder) == '{\n    "n": 1.234560e+05\n}'


def test_deepspeed_config_model_drops_auto_and_forbids_unknown_keys():
    pytest.importorskip("pydantic")
    from launcher.zero.runtime.config_utils import DeepSpeedConfigModel, get_config_default

    class Section(DeepSpeedConfigModel):
        size: int = 4
        name: str = "x"

    assert Section(size="auto", name="y").size == 4 and get_config_default(Section, "size") == 4
    with pytest.raises(Exception, match="extra"):
        Section(sizes=3)


# ---- deepspeed.utils' tensor-fragment family --------------------------------------------------------
def trained_pair(stage, bf16=False):
    """An engine and a plain AdamW copy after one step on the same batch."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    plain = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    plain.load_state_dict(model.state_dict())
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.1}}}
    if bf16:
        config["bf16"] = {"enabled": True}
    engine, *_ = zero.initialize(model=model, config=config)
    reference = torch.optim.AdamW(plain.parameters(), lr=0.1, weight_decay=0.0)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    engine.backward(engine(x.to(engine.module[0].weight.dtype)).float().pow(2).mean())
    engine.step()
    plain(x).pow(2).mean().backward()
    reference.step()
    return engine, plain, reference


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_safe_get_full_fp32_param_and_optimizer_state_are_the_masters(stage):
    from launcher.zero.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    engine, plain, reference = trained_pair(stage)
    for ours, theirs in zip(engine.module.parameters(), plain.parameters()):
        full = safe_get_full_fp32_param(ours)
        assert full.dtype == torch.float32 and torch.allclose(full, theirs, atol=1e-6)
        state = safe_get_full_optimizer_state(ours, "exp_avg_sq")
        assert torch.allclose(state, reference.state[theirs]["exp_avg_sq"], atol=1e-9)


def test_the_full_fp32_master_of_a_bf16_model_is_not_its_rounded_weight():
    from launcher.zero.utils import safe_get_full_fp32_param

    engine, plain, _ = trained_pair(2, bf16=True)
    weight = engine.module[0].weight
    master = safe_get_full_fp32_param(weight)
    assert master.dtype == torch.float32 and torch.equal(master.to(torch.bfloat16), weight.detach())
    assert not torch.equal(master, weight.detach().float())


def test_safe_set_full_fp32_param_writes_the_master_that_the_next_step_publishes():
    from launcher.zero.utils import safe_get_full_fp32_param, safe_set_full_fp32_param, safe_set_full_optimizer_state

    engine, _, _ = trained_pair(2)
    weight = engine.module[2].weight
    value = torch.arange(16, dtype=torch.float32).view(2, 8) / 16
    safe_set_full_fp32_param(weight, value)
    assert torch.equal(safe_get_full_fp32_param(weight), value)
    safe_set_full_optimizer_state(weight, torch.zeros(2, 8), "exp_avg")
    for group in engine.optimizer.param_groups:   # a step that moves nothing: the model takes the master
        group["lr"] = 0.0
    engine.backward(engine(torch.randn(2, 4)).pow(2).mean())
    engine.step()
    assert torch.equal(weight.detach(), value)


def test_the_local_functions_are_stage_3_only_and_give_this_ranks_partition():
    from launcher.zero.utils import (safe_get_full_fp32_param, safe_get_local_fp32_param,
                                     safe_get_local_optimizer_state, safe_set_local_fp32_param)

    engine, _, _ = trained_pair(3)
    weight = engine.module[0].weight
    local = safe_get_local_fp32_param(weight)
    assert local.dim() == 1 and torch.equal(local, safe_get_full_fp32_param(weight).flatten())   # one rank: all of it
    assert safe_get_local_optimizer_state(weight, "exp_avg").shape == local.shape
    safe_set_local_fp32_param(weight, torch.ones_like(local))
    assert torch.equal(safe_get_full_fp32_param(weight), torch.ones(8, 4))
    torch.distributed.destroy_process_group()
    engine, _, _ = trained_pair(1)
    with pytest.raises(AssertionError, match="only defined for ZeRO-3 partitioned parameters"):
        safe_get_local_fp32_param(engine.module[0].weight)


def test_a_parameter_no_engine_trains_reads_as_none_or_its_own_gradient():
    from launcher.zero import utils

    param = torch.nn.Parameter(torch.zeros(2))
    assert utils.safe_get_full_fp32_param(param) is None and utils.safe_get_full_grad(param) is None
    param.grad = torch.ones(2)
    assert utils.safe_get_full_grad(param) is param.grad      # as DeepSpeed: the parameter's own .grad
    utils.safe_set_full_grad(param, torch.full((2,), 3.0))
    assert torch.equal(param.grad, torch.full((2,), 3.0))


# ---- the shim answers every new path ------------------------------------------------------------
NEW_PATHS = ["deepspeed.git_version_info", "deepspeed.runtime.zero.config", "deepspeed.runtime.zero.tiling",
             "deepspeed.runtime.fp16", "deepspeed.runtime.fp16.loss_scaler", "deepspeed.runtime.fp16.fused_optimizer",
             "deepspeed.runtime.fp16.unfused_optimizer", "deepspeed.runtime.bf16_optimizer",
             "deepspeed.runtime.config_utils", "deepspeed.utils.init_on_device", "deepspeed.utils.tensor_fragment"]
NEW_NAMES = ["deepspeed:DeepSpeedConfigError", "deepspeed:OnDevice", "deepspeed:git_hash",
             "deepspeed.zero:unwrap_model_for_generation", "deepspeed.zero:TiledLinear",
             "deepspeed.zero:TiledLinearReturnBias", "deepspeed.runtime.zero:TiledLinear",
             "deepspeed.accelerator:is_current_accelerator_supported", "deepspeed.runtime.lr_schedules:WARMUP_MIN_LR",
             "deepspeed.runtime.config:DeepSpeedConfigError", "deepspeed.runtime.fp16.loss_scaler:DynamicLossScaler",
             "deepspeed.runtime.zero.config:ZeroStageEnum", "deepspeed.utils:unset_z3_leaf_modules",
             "deepspeed.utils:safe_set_full_grad", "deepspeed.utils:safe_get_local_fp32_param"]
SHIM_CHECK = """
import importlib, sys
from launcher.zero.shim import install
install()
for path in sys.argv[1].split(","):
    importlib.import_module(path)
for entry in sys.argv[2].split(","):
    module, name = entry.split(":")
    getattr(importlib.import_module(module), name)
print("ok")
"""


def test_the_shim_answers_each_new_deepspeed_path_and_name():
    done = subprocess.run([sys.executable, "-c", SHIM_CHECK, ",".join(NEW_PATHS), ",".join(NEW_NAMES)],
                          capture_output=True, text=True, cwd=REPO)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


def test_z3_leaf_flags_set_read_and_clear_as_deepspeeds():
    from launcher.zero import utils

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(2, 2)))
    assert utils.set_z3_leaf_modules(model, [torch.nn.ReLU, "Linear"]) == [model[0], model[1][0], model[1][1]]
    assert utils.z3_leaf_module(model[0]) and not utils.z3_leaf_module(model)
    assert utils.get_z3_leaf_modules(model) == [model[0], model[1][0], model[1][1]]
    assert utils.unset_z3_leaf_modules(model, ["torch.nn.modules.linear.Linear"]) == [model[0], model[1][1]]
    assert utils.get_z3_leaf_modules(model) == [model[1][0]]
    with pytest.raises(ValueError, match="No modules of type"):
        utils.set_z3_leaf_modules(model, [torch.nn.Conv1d])
    assert utils.set_z3_leaf_modules(model, [torch.nn.Conv1d], raise_if_not_found=False) == []
    assert utils.set_z3_leaf_modules_by_name(model, ["1", "9"], raise_if_not_found=False) == ([model[1]], ["9"])
