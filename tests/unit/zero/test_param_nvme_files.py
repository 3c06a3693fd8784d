"""offload_param.device nvme on one rank (gloo, in this process): the config notes, the refusals at
initialize, the estimate's host bytes, and the shards file itself (read ahead, stale reads, errors).
(2-rank losses, checkpoints and mid-run errors: tests/dist/test_param_nvme_offload.py.)"""
import errno
import os

import pytest
import torch

from launcher import zero
from launcher.zero.config.load import load_config, no_effect_notes
from launcher.zero.engine import estimate as est
from launcher.zero.errors import ConfigError, NvmeOffloadError


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def config(folder, **offload_optimizer):
    cfg = {"train_micro_batch_size_per_gpu": 4, "zero_allow_untested_optimizer": True,
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 10,
                                 "offload_param": {"device": "nvme", "nvme_path": str(folder), "buffer_count": 2,
                                                   "buffer_size": 64}}}
    if offload_optimizer:
        cfg["zero_optimization"]["offload_optimizer"] = offload_optimizer
    return cfg


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def test_param_nvme_has_no_not_built_note_and_names_aio_and_max_in_cpu():
    cfg = load_config({"train_batch_size": 2, "aio": {"block_size": 1048576},
                       "zero_optimization": {"stage": 3, "offload_param": {
                           "device": "nvme", "nvme_path": "/local_nvme", "max_in_cpu": 5}}})
    notes = no_effect_notes(cfg)
    assert not [n for n in notes if "not built" in n or "host memory instead" in n], notes
    assert [n for n in notes if "'aio' (block_size)" in n and "pread/pwrite" in n], notes
    assert [n for n in notes if "offload_param.max_in_cpu (5) has no effect" in n], notes


def test_a_missing_folder_and_a_too_small_buffer_are_refused_at_initialize_by_key(tmp_path):
    with pytest.raises(ConfigError, match="offload_param.nvme_path") as error:
        zero.initialize(model=model(), config=config(tmp_path / "absent"))
    assert str(tmp_path / "absent") in str(error.value) and error.value.hint
    cfg = config(tmp_path)
    cfg["zero_optimization"]["offload_param"]["buffer_size"] = 31   # the 8x8 weight's shard is 64 elements
    with pytest.raises(ConfigError, match="offload_param.buffer_size 31") as error:
        zero.initialize(model=model(), config=cfg)
    assert "at least 64" in error.value.hint


def test_overlap_step_with_param_nvme_is_refused_by_both_keys(tmp_path):
    with pytest.raises(ConfigError, match="overlap_step with offload_param.device 'nvme'") as error:
        zero.initialize(model=model(), config=config(tmp_path, device="cpu", overlap_step=True))
    assert "remove overlap_step" in error.value.hint


def test_one_rank_trains_like_cpu_offload_with_shards_only_in_the_file(tmp_path):
    def run(cfg):
        engine, *_ = zero.initialize(model=model(), config=cfg)
        x, y = torch.randn(12, 8, generator=torch.Generator().manual_seed(1)), torch.zeros(12, 2)
        losses = []
        for step in range(3):
            loss = torch.nn.functional.mse_loss(engine(x[4 * step:4 * step + 4]), y[4 * step:4 * step + 4])
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        torch.distributed.destroy_process_group()
        return engine, losses
    cpu = config(tmp_path)
    cpu["zero_optimization"]["offload_param"] = {"device": "cpu"}
    _, expected = run(cpu)
    engine, losses = run(config(tmp_path))
    assert losses == expected
    path = os.path.join(tmp_path, "dslaunch-rank0", "params.shards")
    assert os.path.getsize(path) == (64 + 16) * 4   # the two weights' shards, fp32 (the biases stay whole)
    assert all(p.ds_tensor.untyped_storage().nbytes() == 4 for p in engine.module.parameters() if hasattr(p, "ds_state"))
    assert engine.memory_breakdown()["nvme_param_buffers"] == 2 * 64 * 4
    weight = engine.module[0].weight
    with zero.GatheredParameters([weight], modifier_rank=0):   # a change goes to the file and the master
        weight.data.fill_(0.5)
    assert torch.from_file(path, size=64, dtype=torch.float32).eq(0.5).all()
    with zero.GatheredParameters([weight]):
        assert weight.eq(0.5).all()


class _State:
    """What ParamFiles needs of a ShardState."""

    def __init__(self, values):
        self.shard, self.status, self.swap = values, "not_available", None

    @property
    def shard_numel(self):
        return self.shard.numel()


def _files(tmp_path, count=3):
    from launcher.zero.stages.stage3.nvme_params import ParamFiles
    params = [torch.nn.Parameter(torch.empty(0)) for _ in range(3)]
    for index, p in enumerate(params):
        p.ds_state = _State(torch.arange(4, dtype=torch.float32) + 10 * index)
    files = ParamFiles(str(tmp_path), count, 4, pin=False)
    files.adopt(params)
    return files, params


def test_a_read_ahead_is_used_once_and_dropped_when_the_shard_is_written(tmp_path):
    files, params = _files(tmp_path)
    first, second, third = (p.ds_state for p in params)
    files.read_ahead(params)                      # one buffer is kept free: two reads ahead
    assert len(files._ahead) == 2 and len(files._free) == 1
    assert files.read(first, torch.device("cpu")).tolist() == [0, 1, 2, 3]
    files.write(second, torch.tensor([7.0, 8.0]), start=1)   # its read ahead holds the old values: dropped
    assert files.read(second, torch.device("cpu")).tolist() == [10, 7, 8, 13]
    assert files.read(third, torch.device("cpu")).tolist() == [20, 21, 22, 23]
    assert (files.reads, files.reads_ahead) == (3, 1) and sorted(files._free) == [0, 1, 2]
    files.close()


def test_a_removed_folder_and_a_full_disk_fail_by_the_files_name(tmp_path, monkeypatch):
    from launcher.zero.stages.stage3 import nvme_params
    files, params = _files(tmp_path)

    def no_space(*_):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(nvme_params, "_pwrite_all", no_space)
    for param in params:   # queued, each failing on the I/O thread: the write itself raises nothing,
        files.write(param.ds_state, torch.zeros(4))   # so every rank fails at the same next gather
    with pytest.raises(NvmeOffloadError, match="cannot write .*params.shards .No space left") as error:
        files.read(params[2].ds_state, torch.device("cpu"))
    assert str(tmp_path) in error.value.hint
    with pytest.raises(NvmeOffloadError, match="No space left"):   # and every later one, and flush
        files.flush()
    assert len(files._free) == 3 and not files._writes
    files._failure = None
    os.remove(files.path)
    with pytest.raises(NvmeOffloadError, match=f"cannot read {files.path}"):
        files.read(params[0].ds_state, torch.device("cpu"))
    assert len(files._free) == 3    # the buffer came back
    files.close()


def test_writes_run_on_the_io_thread_in_order_bounded_by_the_staging_buffers(tmp_path, monkeypatch):
    """The step's writes leave the training thread; a read queued after a write sees its values, and
    the copies waiting to be written never hold more bytes than the staging buffers."""
    import threading
    import time

    from launcher.zero.stages.stage3 import nvme_params
    files, params = _files(tmp_path)   # 3 buffers of 4 fp32 elements: 48 bytes of pending writes at most
    writers, real = [], nvme_params._pwrite_all

    def slow_write(*args):
        writers.append(threading.current_thread().name)
        time.sleep(0.05)   # the disk is slow: the caller must not wait for it, and a read must
        real(*args)
    monkeypatch.setattr(nvme_params, "_pwrite_all", slow_write)
    first = params[0].ds_state
    for value in range(1, 9):   # 8 writes of 16 bytes: no more than 3 may be pending at once
        files.write(first, torch.full((4,), float(value)))
        assert files.pending_bytes <= files.write_budget() == 48
    assert files.most_pending_bytes == 48
    assert files.read(first, torch.device("cpu")).tolist() == [8, 8, 8, 8]
    assert writers and all(name.startswith("dslaunch-nvme-params") for name in writers), writers
    files.write(params[1].ds_state, torch.tensor([5.0]), start=3)
    files.close()   # the last write is finished before the thread stops
    with open(files.path, "rb") as handle:
        assert torch.frombuffer(bytearray(handle.read()), dtype=torch.float32)[4:8].tolist() == [10, 11, 12, 5]


def test_estimate_counts_only_staging_buffers_for_nvme_params():
    report = est.estimate_memory(10**9, 2, 1, largest_layer_params=10**7, engine="dslaunch")
    nvme, cpu = report.row(3, True, True, param_nvme=True), report.row(3, True, True)
    states_only = report.row(3, True, False)
    assert nvme.options() == "stage=3, offload_optimizer=cpu, offload_param=nvme, zero_init=1"
    assert nvme.cpu_bytes_per_node == states_only.cpu_bytes_per_node + 2 * est.NVME_PARAM_STAGING_BYTES
    assert nvme.cpu_bytes_per_node < cpu.cpu_bytes_per_node and nvme.gpu_bytes_per_device == cpu.gpu_bytes_per_device
    assert not any(r.param_nvme for r in est.estimate_memory(10**9, 2, 1).rows)   # DeepSpeed's figures have none
