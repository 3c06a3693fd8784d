"""The pipeline engine's checkpoint arguments, DeepSpeed's list: honoured, or refused with
NotSupportedError, never accepted and ignored (issue 29 item 3). One rank, one stage, gloo, CPU."""
import pytest
import torch

from launcher import zero
from launcher.zero.errors import NotSupportedError
from launcher.zero.pipe import LayerSpec, PipelineModule

CONFIG = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "Adam", "params": {"lr": 0.1}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}


@pytest.fixture(autouse=True)
def no_process_group_left():
    """zero.initialize starts a one-rank group in the pytest process; other tests start their own."""
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def trained_engine(steps: int, frozen: bool = False):
    torch.manual_seed(0)
    module = PipelineModule([LayerSpec(torch.nn.Linear, 2, 2), LayerSpec(torch.nn.Linear, 2, 2)], num_stages=1,
                            loss_fn=torch.nn.functional.mse_loss)
    if frozen:
        module.get_submodule("0").requires_grad_(False)
    engine, *_ = zero.initialize(model=module, config=CONFIG)
    train(engine, steps)
    return engine


def train(engine, steps: int) -> None:
    x = torch.randn(1, 2)
    for _ in range(steps):
        engine.train_batch(iter([(x, x)] * 2))


def weights(engine) -> dict:
    return {key: value.detach().clone() for key, value in engine.module.state_dict().items()}


def adam_steps(engine) -> int:
    return int(next(iter(engine.optimizer.state.values()))["step"])


def test_load_checkpoint_refuses_a_custom_load_fn(tmp_path):
    engine = trained_engine(1)
    engine.save_checkpoint(tmp_path)
    with pytest.raises(NotSupportedError, match="custom_load_fn"):
        engine.load_checkpoint(tmp_path, custom_load_fn=lambda src, dst: None)


def test_an_argument_deepspeed_does_not_have_is_a_type_error(tmp_path):
    engine = trained_engine(1)
    engine.save_checkpoint(tmp_path)
    with pytest.raises(TypeError, match="load_everything"):
        engine.load_checkpoint(tmp_path, load_everything=True)


def test_load_module_only_restores_the_weights_alone(tmp_path):
    engine = trained_engine(2)
    saved, lr_at_save = weights(engine), engine.get_lr()
    engine.save_checkpoint(tmp_path)
    train(engine, 1)
    lr_now = engine.get_lr()
    assert lr_now != lr_at_save
    path, _ = engine.load_checkpoint(tmp_path, load_module_only=True)
    assert path is not None
    assert all(torch.equal(weights(engine)[key], value) for key, value in saved.items())
    # the optimizer, the scheduler and the counters go on from step 3
    assert (engine.global_steps, engine.global_samples, adam_steps(engine), engine.get_lr()) == (3, 6, 3, lr_now)


def test_load_optimizer_states_false_restores_scheduler_and_counters_but_not_the_optimizer(tmp_path):
    engine = trained_engine(2)
    lr_at_save = engine.get_lr()
    engine.save_checkpoint(tmp_path)
    train(engine, 1)
    engine.load_checkpoint(tmp_path, load_optimizer_states=False)
    assert (engine.global_steps, engine.global_samples, engine.get_lr()) == (2, 4, lr_at_save)
    assert adam_steps(engine) == 3
    engine.load_checkpoint(tmp_path)    # the default: the optimizer state too
    assert adam_steps(engine) == 2


def test_load_lr_scheduler_states_false_keeps_the_running_schedule(tmp_path):
    engine = trained_engine(2)
    engine.save_checkpoint(tmp_path)
    train(engine, 1)
    lr_now = engine.get_lr()
    # (the optimizer's state holds its param groups' lr: leave it out too to see the schedule alone)
    engine.load_checkpoint(tmp_path, load_optimizer_states=False, load_lr_scheduler_states=False)
    assert engine.global_steps == 2 and engine.get_lr() == lr_now


def test_save_latest_false_leaves_latest_on_the_previous_tag(tmp_path):
    engine = trained_engine(1)
    engine.save_checkpoint(tmp_path, tag="first")
    train(engine, 1)
    engine.save_checkpoint(tmp_path, tag="second", save_latest=False)
    assert (tmp_path / "latest").read_text() == "first"
    assert (tmp_path / "second").is_dir()


def test_exclude_frozen_parameters_leaves_them_out_of_the_layer_files(tmp_path):
    engine = trained_engine(1, frozen=True)
    engine.save_checkpoint(tmp_path, tag="all")
    engine.save_checkpoint(tmp_path, tag="trainable", exclude_frozen_parameters=True)

    def keys(tag, layer):
        return set(torch.load(tmp_path / tag / f"layer_{layer:02d}-model_00-model_states.pt", weights_only=False)["state"])
    assert keys("all", 0) == keys("all", 1) == {"weight", "bias"}
    assert keys("trainable", 0) == set() and keys("trainable", 1) == {"weight", "bias"}
    saved = weights(engine)
    with torch.no_grad():
        for param in engine.module.parameters():
            param.add_(1.0)
    engine.load_checkpoint(tmp_path, tag="trainable", load_module_strict=False)
    now = weights(engine)
    assert torch.equal(now["1.weight"], saved["1.weight"])          # trainable: loaded
    assert torch.equal(now["0.weight"], saved["0.weight"] + 1.0)    # frozen: not in the checkpoint
