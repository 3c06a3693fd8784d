"""Optimizer offload's advice lines (issue 43): the arithmetic (engine/offload_advice.py) by hand,
the watcher (engine/offload_advisor.py) on a scripted clock, and a real engine's lines."""
import io
import os

import pytest
import torch

from launcher.zero.engine import offload_advice as advice
from launcher.zero.engine.offload_advisor import OffloadAdvisor, OffloadFacts, host_bandwidth


def test_an_fp32_update_moves_32_bytes_a_parameter_and_a_bf16_one_16():
    # reads p, g, m, v (16 B) + writes p, m, v (12 B) + the upload reads p (4 B)
    assert advice.bytes_per_parameter() == 32
    assert advice.bytes_per_parameter(2, 2, 2) == 16   # bf16 masters, gradients and moments
    assert advice.bytes_per_parameter(4, 4, 2) == 4 + 4 + 4 + 4 + 2 * 2 * 2


def test_the_bound_is_bytes_over_bandwidth():
    # 1e9 parameters x 32 B at 20 GB/s: 1.6 s a step at the least
    assert advice.least_host_seconds(10 ** 9, 32, 20e9) == pytest.approx(1.6)
    assert advice.least_host_seconds(5, 32, 0.0) == float("inf")


@pytest.mark.parametrize("fb, backward, host, overlap, want", [
    (0.3, 0.2, 0.1, False, 4 / 3),    # the host step after the backward
    (0.3, 0.2, 0.1, True, 1.0),       # beside the next forward (0.1 s): hidden
    (0.3, 0.2, 0.5, True, 7 / 3),     # longer than it: backward + host
    (0.3, 0.0, 0.1, True, 1.0),       # backward not measured: two thirds of fb
    (0.0, 0.0, 0.1, True, float("inf")),
])
def test_the_slowdown_to_no_offload(fb, backward, host, overlap, want):
    assert advice.slowdown(fb, backward, host, overlap) == pytest.approx(want)


def test_overlap_hides_the_host_step_behind_the_forward_only():
    # One H100, 2026-12-07 (benchmarks/RESULTS.md), 406M GPT at stage 2 with overlap_step: forward 36.6 ms,
    # backward 68.3 ms, host step ~100 ms, measured 188.5 ms a step against plain's 115.9 (0.615x). The host
    # step waits for the backward's last gradient (clipping's norm), so it cannot hide behind the backward.
    got = advice.slowdown(0.1049, 0.0683, 0.100, True)
    assert 1 / got == pytest.approx(0.615, abs=0.04)
    assert advice.slowdown(0.1049, 0.0683, 0.100, True) > 1.5   # not max(fb, host) / fb, which is ~1.0
    # a forward paced by the host (measured 110 ms of a 178 ms fb) counts as at most half the backward
    assert advice.forward_seconds(0.178, 0.068, True) == pytest.approx(0.034)
    assert advice.forward_seconds(0.178, 0.068, False) == pytest.approx(0.110)


@pytest.mark.parametrize("forward, host, share, want", [
    (0.2, 0.5, 1.0, 0.4),      # 40% of the states offloaded take 0.2 s: they fit
    (0.2, 0.5, 0.5, 0.2),      # measured at ratio 0.5: the host time per share is twice as large
    (0.2, 0.1, 1.0, 1.0),      # already fits: full offload
    (0.2, 0.0, 1.0, 1.0),
])
def test_the_ratio_that_hides_the_host_step(forward, host, share, want):
    assert advice.hiding_ratio(forward, host, share) == pytest.approx(want)


def test_samples_drop_the_warm_up_and_keep_the_medians():
    samples = advice.StepSamples(count=3, skip=1)
    done = [samples.add(fb, host, fb / 2) for fb, host in ((9.0, 9.0), (1.0, 4.0), (3.0, 5.0), (2.0, 6.0), (7.0, 7.0))]
    assert done == [False, False, False, True, False]
    assert samples.medians() == (2.0, 5.0, 1.0)


def test_the_lines_say_the_numbers():
    start = advice.start_line(20e9, 256 << 20, 32, 1_000_000, 0.0016)
    assert "20.0 GB/s" in start and "256 MiB" in start and "32 B a parameter" in start and "1,000,000" in start
    assert "1.60 ms" in start
    line = advice.measured_line(10, 0.3, 0.2, 0.5, 0.4, True, 1.0, 0.2)
    assert "forward+backward 300.00 ms (backward 200.00)" in line and "host step 500.00 ms" in line
    assert "2.33x" in line and "offload_optimizer.ratio 0.20" in line


class Lines:
    """The monitor's two calls, kept."""

    def __init__(self):
        self.logged, self.warned = [], []

    def log(self, text):
        self.logged.append(text)

    def warn(self, text):
        self.warned.append(text)


class Clock:
    """A clock that returns the times given, in turn."""

    def __init__(self, times):
        self.times = list(times)

    def __call__(self):
        return self.times.pop(0)


def test_the_advisor_says_the_bound_then_the_measured_advice_once():
    facts = OffloadFacts(offloaded=1000, total=2000, per_parameter=32, overlap=False, ratio=0.5)
    # per step, two micro-steps: forward, backward, forward (the first backward ends), backward, step (the
    # second ends; then the step's own clock), step done -> fb 0.2 s, backward 0.03 + 0.08 s, host 0.1 s
    times = [10.0 * step + t for step in range(4) for t in (0.0, 0.05, 0.08, 0.12, 0.2, 0.2, 0.3)]
    lines = Lines()
    advisor = OffloadAdvisor(facts, lines, clock=Clock(times), samples=advice.StepSamples(count=2, skip=1))
    advisor.start(bandwidth=lambda: 32e9)
    assert lines.logged == [advice.start_line(32e9, 256 << 20, 32, 1000, 1e-6)]
    for _ in range(4):
        advisor.forward_begins()
        advisor.backward_begins()
        advisor.forward_begins()   # a second micro-step: the accumulation's time runs on
        advisor.backward_begins()
        advisor.step_begins()
        advisor.step_done(skipped=0)
    assert len(lines.logged) == 2 and not lines.warned
    assert advisor.samples.backward == pytest.approx([0.11, 0.11])
    # host 0.1 s measured at share 0.5: 0.2 s for everything; the forward is 0.09 s, so share 0.45 fits in it
    line = lines.logged[1]
    assert "forward+backward 200.00 ms (backward 110.00)" in line and "host step 100.00 ms" in line
    assert "about 1.50x" in line and "offload_optimizer.ratio 0.45 would fit" in line


def test_a_skipped_step_is_not_a_sample():
    facts = OffloadFacts(10, 10, 32, False, 1.0)
    times = [0.0, 1.0, 1.5, 2.0, 3.0, 3.5]
    advisor = OffloadAdvisor(facts, Lines(), clock=Clock(times), samples=advice.StepSamples(count=5, skip=0))
    for skipped in (0, 1):   # the second step overflowed (fp16): its step ran no Adam
        advisor.forward_begins()
        advisor.step_begins()
        advisor.step_done(skipped=skipped)
    assert advisor.samples.fb == [1.0]


def test_a_failing_watcher_is_a_warning_and_never_the_steps():
    facts = OffloadFacts(10, 10, 32, False, 1.0)
    lines = Lines()

    def broken():
        raise OSError("no memory for the copy")
    advisor = OffloadAdvisor(facts, lines, clock=Clock([]))
    advisor.start(bandwidth=broken)
    assert lines.logged == [] and "offload advice: OSError: no memory for the copy" in lines.warned[0]
    advisor.forward_begins()   # stopped: the empty clock is never asked
    advisor.step_begins()
    advisor.step_done(0)
    assert len(lines.warned) == 1


def test_the_bandwidth_is_measured_once():
    first = host_bandwidth(1 << 20)
    assert first > 0 and host_bandwidth(1 << 20) == first


@pytest.fixture
def one_rank(monkeypatch):
    from tests.helpers.world import free_port
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _engine_lines(offload, capsys, steps=13):
    from launcher import zero
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    zero_section = {"stage": 2}
    if offload:
        zero_section["offload_optimizer"] = offload
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": zero_section,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "steps_per_print": 1000}
    engine, _, _, _ = zero.initialize(model=model, model_parameters=model.parameters(), config=config)
    for _ in range(steps):
        engine.backward(engine(torch.randn(2, 8)).square().mean())
        engine.step()
    engine.destroy()
    return [line for line in capsys.readouterr().out.splitlines() if "offload:" in line]


@pytest.mark.parametrize("overlap", [False, True])
def test_an_offloading_engine_says_the_bound_and_the_advice(overlap, one_rank, capsys):
    lines = _engine_lines({"device": "cpu", "overlap_step": overlap}, capsys)
    assert len(lines) == 2, lines
    assert "32 B a parameter" in lines[0] and f"{8 * 32 + 32 + 32 * 2 + 2:,} offloaded parameters" in lines[0]
    assert "over 10 steps forward+backward" in lines[1] and "offload_optimizer.ratio" in lines[1]


def test_an_engine_without_offload_says_nothing_of_it(one_rank, capsys):
    assert _engine_lines(None, capsys) == []
