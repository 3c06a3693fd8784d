"""Stage 3 in bf16 keeps a group's shards and persistent parameters as views of one buffer laid
out like the fp32 master, so the step writes the weights back with one cast copy per range
instead of one per parameter; the background step's CPU Adam keeps a core free. One rank, gloo, CPU."""
import pytest
import torch

from launcher import zero
from launcher.zero.stages.stage3 import params as P
from launcher.zero.stages.step_overlap import step_threads


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def build(dtype_block=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 512), torch.nn.Tanh(), torch.nn.Linear(512, 300),
                                torch.nn.Tanh(), torch.nn.Linear(300, 4))
    config = {"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 1000},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
    config.update({"bf16": {"enabled": True}} if dtype_block is None else dtype_block)
    engine, _, _, _ = zero.initialize(model=model, config=config)
    return engine


def tensors_of(strategy, position):
    return [p.data if slot.persistent else p.ds_state.shard
            for p, slot in zip(strategy.group_params[position], strategy.group_slots[position])]


def test_bf16_shards_and_persistent_params_are_views_of_one_buffer_laid_out_like_the_master():
    strategy = build().strategy
    flat = strategy.flat_params[0]
    assert flat is not None and flat.dtype == torch.bfloat16
    slots = strategy.group_slots[0]
    assert any(s.persistent for s in slots) and any(not s.persistent for s in slots)
    for tensor, slot in zip(tensors_of(strategy, 0), slots):
        assert tensor.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
        assert tensor.storage_offset() == slot.offset
    assert torch.equal(flat, strategy.masters[0].to(torch.bfloat16))


def test_the_step_writes_the_weights_back_with_one_copy_per_group(monkeypatch):
    engine = build()
    strategy = engine.strategy
    x = torch.randn(8, 16).to(torch.bfloat16)
    engine.backward(engine(x).float().pow(2).mean())
    copies = []
    original = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda t, *a, **k: (copies.append(t.numel()), original(t, *a, **k))[1])
    strategy.after_optimizer_step()
    monkeypatch.undo()
    assert copies == [strategy.masters[0].numel()]
    engine.step()
    assert torch.equal(strategy.flat_params[0], strategy.masters[0].to(torch.bfloat16))
    for p in engine.module.parameters():   # gathered values are the updated masters
        if P.is_partitioned(p):
            P.finish_gather(p)
            assert p.dtype == torch.bfloat16
            P.release(p)


def test_fp32_masters_alias_the_shards_and_need_no_buffer():
    strategy = build({}).strategy
    assert strategy.flat_params == [None] and strategy.aliased


@pytest.mark.parametrize("env, expected", [("3", 3), ("", None), ("zero", None)])
def test_the_background_adam_leaves_the_training_thread_a_core(monkeypatch, env, expected):
    monkeypatch.setenv("DSLAUNCH_CPU_ADAM_THREADS", env)
    cores = len(__import__("os").sched_getaffinity(0))
    assert step_threads() == (expected if expected is not None else max(1, cores - 1))


@pytest.mark.parametrize("numel, piece, source_dtype, target_dtype", [
    (10, 3, torch.float32, torch.bfloat16),    # a last short piece, cast on the way
    (9, 3, torch.float32, torch.float32),      # whole pieces, no cast
    (5, 8, torch.bfloat16, torch.float32),     # one piece larger than the tensor
    (0, 4, torch.float32, torch.bfloat16),
])
def test_copy_in_pieces_copies_every_value_once(numel, piece, source_dtype, target_dtype):
    from launcher.zero.stages.placement import copy_in_pieces

    source = torch.randn(numel).to(source_dtype)
    target = torch.full((numel,), float("nan"), dtype=target_dtype)
    copy_in_pieces(target, source, piece)
    assert torch.equal(target, source.to(target_dtype))
