"""bf16 master weights, gradients and Adam moments (issue 43 item 3): DeepSpeed 0.19.8's
``bf16.bf16_master_weights_and_grads`` and ``bf16.bf16_optimizer_states``, honoured or refused by name.

DeepSpeed's rules (runtime/config.py, base_optimizer._configure_master_weights): both keys need ZeRO
1-3; the moments in bf16 need the masters in bf16; bf16 masters need optimizer offload with its CPU
Adam unless the moments are bf16 too and stay on the device; offloaded bf16 moments need the CPU
Adam to keep its moments in the parameters' dtype (``fp32_optimizer_states=False``).
"""
import pytest
import torch

from launcher import zero
from launcher.zero.config.load import load_config, no_effect_notes
from launcher.zero.errors import ConfigError
from launcher.zero.optim.adam import DeepSpeedCPUAdam
from tests.helpers.tiny import bf16_square_loss_steps

MASTERS = {"bf16_master_weights_and_grads": True}
STATES = {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
OFFLOAD = {"device": "cpu", "pin_memory": True}


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def config(bf16=None, stage=2, offload=True, overlap=False, optimizer="AdamW", enabled=True):
    zero_cfg = {"stage": stage}
    if offload:
        zero_cfg["offload_optimizer"] = dict(OFFLOAD, overlap_step=overlap)
    return {"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 0.05,
            "bf16": {"enabled": enabled, **(bf16 or {})}, "zero_optimization": zero_cfg,
            "optimizer": {"type": optimizer, "params": {"lr": 0.01, "weight_decay": 0.1}}}


def engine_for(cfg, optimizer=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    engine, *_ = zero.initialize(model=model, config=cfg, optimizer=optimizer)
    return engine


# ---- the config ----------------------------------------------------------------------------
@pytest.mark.parametrize("keys", [MASTERS, STATES])
def test_the_keys_are_honoured_not_named_as_without_effect(keys):
    notes = no_effect_notes(load_config(config(keys)))
    assert not [note for note in notes if "bf16_" in note], notes


@pytest.mark.parametrize("bf16, stage, offload, enabled, message", [
    ({"bf16_optimizer_states": True}, 2, True, True,
     "bf16.bf16_optimizer_states needs bf16.bf16_master_weights_and_grads"),
    (MASTERS, 0, False, True, "bf16.bf16_master_weights_and_grads needs ZeRO stage 1, 2 or 3"),
    (STATES, 0, False, True, "bf16.bf16_master_weights_and_grads needs ZeRO stage 1, 2 or 3"),
    (MASTERS, 2, True, False, "bf16.bf16_master_weights_and_grads needs bf16.enabled"),
    (MASTERS, 2, False, True, "bf16.bf16_master_weights_and_grads needs zero_optimization.offload_optimizer"),
])
def test_what_deepspeed_refuses_is_a_config_error_naming_the_key(bf16, stage, offload, enabled, message):
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(config(bf16, stage=stage, offload=offload, enabled=enabled))
    assert caught.value.hint


def test_offloaded_bf16_masters_need_the_cpu_adam():
    with pytest.raises(ConfigError, match="bf16_master_weights_and_grads with offload_optimizer needs the engine's "
                                          "CPU Adam") as caught:
        engine_for(config(MASTERS, optimizer="Adagrad"))
    assert "AdamW" in caught.value.hint


def test_offloaded_bf16_moments_refuse_a_cpu_adam_told_to_keep_fp32_moments():
    def fp32_moments(params):
        return DeepSpeedCPUAdam(params, lr=0.01, fp32_optimizer_states=True)

    cfg = config(STATES)
    cfg.pop("optimizer")
    with pytest.raises(ConfigError, match="keep bf16 moments: it was built with fp32_optimizer_states=True") as caught:
        engine_for(cfg, optimizer=fp32_moments)
    assert "fp32_optimizer_states=False" in caught.value.hint


# ---- the engine: where each tensor lives and in what dtype ----------------------------------
def _dtypes(engine):
    optimizer = engine.basic_optimizer
    masters = [p for group in optimizer.param_groups for p in group["params"]]
    moments = [t for state in optimizer.state.values() for key, t in state.items() if key.startswith("exp_avg")]
    return masters, moments


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("keys, moment_dtype", [(MASTERS, torch.float32), (STATES, torch.bfloat16)])
def test_offload_keeps_bf16_masters_and_grads_on_the_host(stage, keys, moment_dtype):
    engine = engine_for(config(keys, stage=stage))
    bf16_square_loss_steps(engine, 2)
    masters, moments = _dtypes(engine)
    assert type(engine.basic_optimizer).__name__ == "CPUAdam"
    assert {(m.dtype, m.device.type) for m in masters} == {(torch.bfloat16, "cpu")}
    assert moments and {(t.dtype, t.device.type) for t in moments} == {(moment_dtype, "cpu")}
    numel = sum(m.numel() for m in masters)
    memory = engine.memory_breakdown()
    assert memory["master_weights"] == 2 * numel or stage == 3 and memory["master_weights"] == 0
    assert memory["optimizer_states"] == 2 * numel * moment_dtype.itemsize
    if stage < 3:   # stages 1-2 copy the gradients to a host buffer in the masters' dtype (stage 3 feeds them)
        assert memory["host_gradients"] == 2 * numel


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_bf16_moments_without_offload_stay_on_the_device_as_deepspeed_allows(stage):
    engine = engine_for(config(STATES, stage=stage, offload=False))
    bf16_square_loss_steps(engine, 2)
    masters, moments = _dtypes(engine)
    assert {m.dtype for m in masters} == {torch.bfloat16}
    assert moments and {t.dtype for t in moments} == {torch.bfloat16}


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("keys", [MASTERS, STATES])
def test_overlap_step_takes_the_same_steps_with_bf16_states(stage, keys):
    engine = engine_for(config(keys, stage=stage))
    plain = bf16_square_loss_steps(engine, 3)
    weights = [p.detach().clone() for p in engine.module.parameters()] if stage < 3 else None
    torch.distributed.destroy_process_group()
    engine = engine_for(config(keys, stage=stage, overlap=True))
    overlapped = bf16_square_loss_steps(engine, 3)
    engine.wait_for_step()
    assert overlapped == pytest.approx(plain, rel=1e-6)
    if weights is not None:
        assert all(torch.equal(a, b) for a, b in zip(weights, engine.module.parameters()))


# ---- checkpoints ---------------------------------------------------------------------------
@pytest.mark.parametrize("stage", [2, 3])
def test_a_checkpoint_resumes_bf16_states_to_the_same_bits(stage, tmp_path):
    straight = engine_for(config(STATES, stage=stage))
    bf16_square_loss_steps(straight, 4)
    want = straight.module_state_dict()
    torch.distributed.destroy_process_group()
    first = engine_for(config(STATES, stage=stage))
    bf16_square_loss_steps(first, 2)
    first.save_checkpoint(str(tmp_path))
    torch.distributed.destroy_process_group()
    resumed = engine_for(config(STATES, stage=stage))
    resumed.load_checkpoint(str(tmp_path))
    _, moments = _dtypes(resumed)
    assert moments and {t.dtype for t in moments} == {torch.bfloat16}
    # the data restarts at its seed: steps 3-4 of the straight run see other batches, so compare
    # the resumed run with a straight run of the same two batches twice
    bf16_square_loss_steps(resumed, 2)
    got = resumed.module_state_dict()
    torch.distributed.destroy_process_group()
    twice = engine_for(config(STATES, stage=stage))
    bf16_square_loss_steps(twice, 2)
    bf16_square_loss_steps(twice, 2)
    assert all(torch.equal(got[k], v) for k, v in twice.module_state_dict().items())
    assert not all(torch.equal(got[k], v) for k, v in want.items())   # the comparison sees a difference


def test_fp32_moments_saved_load_as_bf16_moments_when_the_config_asks(tmp_path):
    engine = engine_for(config(MASTERS, stage=2))
    bf16_square_loss_steps(engine, 2)
    engine.save_checkpoint(str(tmp_path))
    torch.distributed.destroy_process_group()
    resumed = engine_for(config(STATES, stage=2))
    resumed.load_checkpoint(str(tmp_path))
    _, moments = _dtypes(resumed)
    assert moments and {t.dtype for t in moments} == {torch.bfloat16}
    bf16_square_loss_steps(resumed, 1)   # and it steps


# ---- DeepSpeed's arithmetic where it differs from ours with fp32 masters --------------------
@pytest.mark.parametrize("accum, want", [(None, torch.bfloat16), ("fp32", torch.float32)])
def test_stage3_adds_micro_steps_up_in_the_configured_dtype_with_bf16_masters(accum, want):
    """fp32 masters add stage 3's offloaded micro-steps up in fp32; bf16 masters take bf16 gradients
    as DeepSpeed does (its stage 3 adds them up in the model's dtype), unless data_types says fp32."""
    cfg = dict(config(STATES, stage=3), gradient_accumulation_steps=2)
    if accum:
        cfg["data_types"] = {"grad_accum_dtype": accum}
    engine = engine_for(cfg)
    assert {g.dtype for g in engine.strategy.grads} == {want}
    assert {s.dtype for s in engine.strategy.feed.slots} == {torch.bfloat16}   # the CPU Adam reads bf16


def test_bf16_moments_on_the_device_take_the_fused_kernel():
    """torch's foreach AdamW over bf16 computes in bf16; the fused kernel in fp32, as DeepSpeed's."""
    engine = engine_for(config(STATES, stage=2, offload=False))
    assert all(group["fused"] for group in engine.basic_optimizer.param_groups)
