"""Counting FLOPs does not change what runs (issue 39): with MFU on (DSLAUNCH_PEAK_TFLOPS) or the flops
profiler, a ``compile``-enabled engine still compiles on the rank that counts, the count is the eager
model's, and no step after the first breaks a graph or recompiles. Before, the counter's dispatch mode
was active at the compiled forward's first call: dynamo skipped the code for good, 0 graphs."""
import pytest
import torch

from launcher import zero
from launcher.zero.engine.compiling import compile_stats
from launcher.zero.flops.counter import eager_counting_supported
from tests.helpers.gpt import GPT, GPTConfig

CONFIG = GPTConfig(n_layer=2, n_embd=32, n_head=4, seq_len=16, vocab_size=96)
STEPS = 4

pytestmark = pytest.mark.skipif(not eager_counting_supported(), reason="torch.compiler.set_stance is torch >= 2.6")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    torch._dynamo.reset()


def train(stage: int, compiled: bool, extra: dict | None = None) -> tuple[list[float], object, list[dict]]:
    """(losses, engine, compile_stats() after every step) of STEPS steps."""
    torch.manual_seed(0)
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, "zero_optimization": {"stage": stage},
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, **(extra or {})}
    if compiled:
        config["compile"] = {"enabled": True, "backend": "aot_eager", "kwargs": {"dynamic": False}}
    engine, *_ = zero.initialize(model=GPT(CONFIG), config=config)
    gen = torch.Generator().manual_seed(1)
    losses, stats = [], []
    for _ in range(STEPS):
        tokens = torch.randint(0, CONFIG.vocab_size, (2, CONFIG.seq_len + 1), generator=gen)
        loss = engine(tokens[:, :-1], tokens[:, 1:])
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
        stats.append(compile_stats())
    engine.destroy()
    torch.distributed.destroy_process_group()
    return losses, engine, stats


@pytest.mark.parametrize("stage", [0, 3])
def test_the_counting_rank_compiles_and_still_reports_mfu(monkeypatch, capsys, stage):
    monkeypatch.setenv("DSLAUNCH_PEAK_TFLOPS", "1e-6")
    eager_losses, eager, _ = train(stage, compiled=False)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    capsys.readouterr()
    losses, engine, stats = train(stage, compiled=True)
    out, err = capsys.readouterr()
    final = stats[-1]
    # one graph: the whole module at stage 0, one per block shared by both blocks at stage 3
    assert final["unique_graphs"] >= 1, final
    assert final["graph_breaks"] == 0 and final["recompiles"] == 0, final
    assert stats[1] == final, stats            # nothing new after the first compiled step
    assert engine.instruments.flops_per_step == eager.instruments.flops_per_step > 0   # the eager model's count
    assert losses == pytest.approx(eager_losses, rel=1e-6)
    assert "warning" not in err
    progress = [line for line in out.splitlines() if " progress " in line]
    assert len(progress) == STEPS and all("mfu=" in line for line in progress)


@pytest.mark.parametrize("profile_step", [0, 2])
def test_the_flops_profiler_leaves_compiled_code_alone(tmp_path, profile_step):
    """At step 0 the profiled step is the compiled forward's first call; at step 2 compiled code exists."""
    profile = tmp_path / "profile.txt"
    _, engine, stats = train(0, compiled=True, extra={
        "flops_profiler": {"enabled": True, "profile_step": profile_step, "output_file": str(profile)}})
    first_compiled = stats[1] if profile_step == 0 else stats[0]   # step 0 is eager when it is counted
    assert first_compiled["unique_graphs"] >= 1 and first_compiled["graph_breaks"] == 0, stats
    assert stats[-1] == first_compiled, stats
    assert f"FLOPs profile of step {profile_step}" in profile.read_text()
    _, eager, _ = train(0, compiled=False, extra={"flops_profiler": {"enabled": True, "profile_step": profile_step,
                                                                     "output_file": str(tmp_path / "eager.txt")}})
    assert engine.instruments.flops_per_step == eager.instruments.flops_per_step > 0


def test_without_set_stance_a_compiled_engine_is_not_counted_and_says_so_once(monkeypatch, capsys):
    """torch 2.4 and 2.5 (no torch.compiler.set_stance): compile wins over MFU, with one warning."""
    monkeypatch.delattr(torch.compiler, "set_stance")
    monkeypatch.setenv("DSLAUNCH_PEAK_TFLOPS", "1e-6")
    _, engine, stats = train(0, compiled=True)
    assert stats[0]["unique_graphs"] >= 1 and stats[-1] == stats[0], stats
    assert engine.instruments.flops_per_step is None
    out, err = capsys.readouterr()
    [warning] = [line for line in err.splitlines() if "warning" in line]
    assert "no MFU: counting FLOPs would keep torch.compile from compiling" in warning
    assert not any("mfu=" in line for line in out.splitlines())
