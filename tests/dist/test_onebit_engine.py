"""OneBitAdam through the engine (config type "OneBitAdam", stage 0) on 2 gloo ranks.

The engine must leave gradient communication to the optimizer: its parameters then follow
the optimizer used directly on a plain model, and a checkpoint resumes in the compressed phase.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORLD_SIZE = 2
REPO = Path(__file__).resolve().parents[2]
CONFIG = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
          "optimizer": {"type": "OneBitAdam",
                        "params": {"lr": 0.01, "freeze_step": 2, "comm_backend_name": "gloo"}}}


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 128), torch.nn.Tanh(), torch.nn.Linear(128, 3))


def batch(rank, step):
    gen = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen)


def worker(out_dir):
    import torch.distributed as dist

    from launcher import zero
    from launcher.zero.optim.onebit import OnebitAdam

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    engine, opt, _, _ = zero.initialize(model=make_model(), config=CONFIG)
    direct_model = make_model()
    direct = OnebitAdam(direct_model.parameters(), lr=0.01, freeze_step=2, comm_backend_name="gloo")
    result = {"type": type(opt.optimizer).__name__, "engine": [], "direct": [], "phase": []}   # inside the engine's
    for step in range(1, 5):
        x, y = batch(rank, step)
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
        direct.zero_grad()
        torch.nn.functional.mse_loss(direct_model(x), y).backward()
        direct.step()
        result["engine"].append(torch.cat([p.detach().reshape(-1) for p in engine.module.parameters()]))
        result["direct"].append(torch.cat([p.detach().reshape(-1) for p in direct_model.parameters()]))
        result["phase"].append(opt.last_step_comm["phase"])
    engine.save_checkpoint(os.path.join(out_dir, "ckpt"))
    engine2, opt2, _, _ = zero.initialize(model=make_model(), config=CONFIG)
    engine2.load_checkpoint(os.path.join(out_dir, "ckpt"))
    result["resumed_global_step"] = opt2.global_step
    result["resumed_compressing"] = opt2.compressing
    result["saved_errors"] = {k: opt.extra_state_dict()[k] for k in ("worker_error", "server_error")}
    result["resumed_errors"] = {k: opt2.extra_state_dict()[k] for k in ("worker_error", "server_error")}
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("onebit_engine")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = []
    for rank in range(WORLD_SIZE):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, str(out)], env=env))
    assert [p.wait(timeout=120) for p in procs] == [0] * WORLD_SIZE
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD_SIZE)]


def test_engine_builds_onebit_adam_and_it_compresses_after_the_freeze(ranks):
    assert ranks[0]["type"] == "OnebitAdam"
    assert ranks[0]["phase"] == ["warmup", "warmup", "compressed", "compressed"]


def test_engine_leaves_communication_to_the_optimizer(ranks):
    for r in range(WORLD_SIZE):
        for got, want in zip(ranks[r]["engine"], ranks[r]["direct"]):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ranks[0]["engine"][-1], ranks[1]["engine"][-1], rtol=0, atol=0)


def test_engine_checkpoint_resumes_in_the_compressed_phase(ranks):
    for r in range(WORLD_SIZE):
        assert ranks[r]["resumed_global_step"] == 4 and ranks[r]["resumed_compressing"]
        for key in ("worker_error", "server_error"):  # the error feedback survives the checkpoint
            saved, resumed = ranks[r]["saved_errors"][key], ranks[r]["resumed_errors"][key]
            assert saved is not None and saved.abs().sum() > 0
            torch.testing.assert_close(resumed, saved, rtol=0, atol=0)


if __name__ == "__main__":
    worker(sys.argv[1])
