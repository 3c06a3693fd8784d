"""DeepSpeed's optional arguments of the engine's methods: honoured, or refused with
NotSupportedError, never accepted and ignored (issue 29 item 3). One rank, gloo, CPU."""
import pytest
import torch

from launcher import zero
from launcher.zero.errors import ConfigError, NotSupportedError

CONFIG = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Adam", "params": {"lr": 0.1}}}


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def partly_frozen_engine():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model[0].requires_grad_(False)
    engine, *_ = zero.initialize(model=model, config=CONFIG)
    engine.backward(engine(torch.randn(2, 4)).pow(2).mean())
    engine.step()
    return engine


def test_save_checkpoint_leaves_frozen_parameters_out_when_asked(tmp_path):
    engine = partly_frozen_engine()
    engine.save_checkpoint(tmp_path, tag="all")
    engine.save_checkpoint(tmp_path, tag="trainable", exclude_frozen_parameters=True)
    every = torch.load(tmp_path / "all" / "model_states.pt", weights_only=False)["module"]
    trainable = torch.load(tmp_path / "trainable" / "model_states.pt", weights_only=False)["module"]
    assert set(every) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    assert set(trainable) == {"1.weight", "1.bias"}
    trained = engine.module[1].weight.detach().clone()
    with torch.no_grad():
        engine.module[1].weight.zero_()
    path, _ = engine.load_checkpoint(tmp_path, tag="trainable", load_module_strict=False)
    assert path is not None and torch.equal(engine.module[1].weight, trained)


def test_save_16bit_model_leaves_frozen_parameters_out_when_asked(tmp_path):
    engine = partly_frozen_engine()
    assert engine.save_16bit_model(tmp_path, "all.bin")
    assert engine.save_16bit_model(tmp_path, "trainable.bin", exclude_frozen_parameters=True)
    assert set(torch.load(tmp_path / "all.bin")) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    assert set(torch.load(tmp_path / "trainable.bin")) == {"1.weight", "1.bias"}


def test_load_checkpoint_refuses_a_custom_load_fn(tmp_path):
    engine = partly_frozen_engine()
    engine.save_checkpoint(tmp_path)
    with pytest.raises(NotSupportedError, match="custom_load_fn"):
        engine.load_checkpoint(tmp_path, custom_load_fn=lambda *args: None)


def test_deepspeed_io_takes_the_workers_and_refuses_an_unknown_route():
    engine, *_ = zero.initialize(model=torch.nn.Linear(4, 2), config=CONFIG)
    dataset = torch.utils.data.TensorDataset(torch.zeros(6, 4))
    assert engine.deepspeed_io(dataset).num_workers == 2   # DeepSpeed's 2 x device_count; 1 device on a CPU
    assert engine.deepspeed_io(dataset, num_local_io_workers=0).num_workers == 0
    loader = engine.deepspeed_io(dataset, route="train", pin_memory=False, num_local_io_workers=3)
    assert loader.num_workers == 3 and not loader.pin_memory
    assert not engine.deepspeed_io(dataset, route="eval").data_sampler.shuffle
    with pytest.raises(ConfigError, match="route 'test'"):
        engine.deepspeed_io(dataset, route="test")
