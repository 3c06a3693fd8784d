"""MFU on the progress line: the peak from DSLAUNCH_PEAK_TFLOPS or the card's name; nothing when unknown."""
import pytest

from launcher.zero.engine.monitor import progress_line
from launcher.zero.flops.peak import peak_tflops, throughput_fields


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0),
    ("NVIDIA H200", 989.0), ("NVIDIA GH200 480GB", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA A100 80GB PCIe", 312.0), ("NVIDIA GeForce RTX 4090", None), (None, None)])
def test_the_peak_comes_from_the_cards_name(name, peak):
    assert peak_tflops({}, name) == peak


def test_the_environment_wins_and_a_bad_value_means_unknown():
    assert peak_tflops({"DSLAUNCH_PEAK_TFLOPS": "123.5"}, "NVIDIA H100 80GB HBM3") == 123.5
    assert peak_tflops({"DSLAUNCH_PEAK_TFLOPS": "fast"}, "NVIDIA H100 80GB HBM3") is None
    assert peak_tflops({"DSLAUNCH_PEAK_TFLOPS": "0"}, None) is None


def test_tflops_and_mfu_follow_tokens_on_the_progress_line():
    # 4e14 FLOPs per step at 1.5 steps/s = 600 TFLOP/s per rank; 600 / 989 = 60.7%
    fields = throughput_fields(4e14, 1.5, 989.0)
    assert fields == {"tflop/s": "600", "mfu": "60.7%"}
    line = progress_line(10, None, {"loss": 2.5}, 96.0, 1024, 5.0, fields)
    tokens = dict(t.split("=", 1) for t in line.split()[1:])
    assert tokens["tflop/s"] == "600" and tokens["mfu"] == "60.7%"
    assert line.index("tokens/s=") < line.index("tflop/s=") < line.index("mfu=")


def test_nothing_is_shown_where_the_peak_or_the_count_is_unknown():
    assert throughput_fields(4e14, 1.5, None) == {}
    assert throughput_fields(None, 1.5, 989.0) == {}
    assert "mfu" not in progress_line(10, None, {}, 96.0, 1024, 5.0, throughput_fields(4e14, 1.5, None))


def test_the_engines_progress_line_shows_mfu_against_the_given_peak(monkeypatch, capsys):
    import torch

    from launcher import zero
    from tests.helpers.gpt import GPT, TINY

    monkeypatch.setenv("DSLAUNCH_PEAK_TFLOPS", "1e-6")   # 1 MFLOP/s: a CPU shows a visible MFU
    torch.manual_seed(0)
    engine, *_ = zero.initialize(model=GPT(TINY), config={
        "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    try:
        for _ in range(2):
            idx = torch.randint(0, TINY.vocab_size, (2, TINY.seq_len))
            engine.backward(engine(idx, idx))
            engine.step()
    finally:
        torch.distributed.destroy_process_group()
    lines = [line for line in capsys.readouterr().out.splitlines() if " progress " in line]
    first, second = (dict(t.split("=", 1) for t in line.split()[2:]) for line in lines)
    assert "mfu" in first   # the first step is counted before its line is printed
    # tflop/s is the step's FLOPs x steps/s. samples/s is printed to 0.1, so the rate behind it lies
    # within 0.05 of the printed one: a bound from the printing, whatever speed the machine ran at
    # (a fixed relative tolerance fails a slow run, where 0.05 is a large share of the rate)
    samples_per_second = float(second["samples/s"])
    per_sample = 115343360 / 2 / 1e12
    low, high = max(0.0, samples_per_second - 0.05) * per_sample, (samples_per_second + 0.05) * per_sample
    assert low * (1 - 1e-3) <= float(second["tflop/s"]) <= high * (1 + 1e-3), (second, low, high)   # .4g
    assert second["mfu"].endswith("%")
