"""FLOPs counted by torch.utils.flop_counter match the closed forms (a Linear, the GPT of tests/helpers),
get_model_profile answers as DeepSpeed's does, and the engine prints the profile at the profile step."""
import pytest
import torch

from launcher import zero
from launcher.zero.flops.counter import count_flops
from launcher.zero.flops.profiler import get_model_profile
from tests.helpers.gpt import GPT, TINY, GPTConfig


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_a_linear_costs_2_bnk_forward_and_twice_that_backward():
    batch, n_in, n_out = 8, 32, 24
    layer = torch.nn.Linear(n_in, n_out)
    x = torch.randn(batch, n_in, requires_grad=True)
    counted = count_flops(lambda: layer(x).sum().backward())
    assert counted.total == 3 * 2 * batch * n_in * n_out   # forward, grad of input, grad of weight
    flops, macs, params = get_model_profile(layer, input_shape=(batch, n_in), print_profile=False, as_string=False)
    assert (flops, macs, params) == (2 * batch * n_in * n_out, batch * n_in * n_out, n_in * n_out + n_out)


def gpt_step_flops(config: GPTConfig, tokens: int) -> tuple[int, int]:
    """(forward, forward + backward) FLOPs of the GPT: 2 per multiply-add of every matrix product
    (embedding lookups excluded, the head included) and attention's two products; the backward
    doubles the products and recomputes the scores (5 attention products instead of 2)."""
    d, layers, s = config.n_embd, config.n_layer, config.seq_len
    matmul_params = layers * 12 * d * d + config.vocab_size * d
    forward = 2 * matmul_params * tokens + layers * 4 * d * s * tokens
    backward = 4 * matmul_params * tokens + layers * 10 * d * s * tokens
    return forward, forward + backward


def test_the_gpt_examples_step_matches_its_closed_form_in_total_and_per_block():
    model = GPT(TINY)
    idx = torch.randint(0, TINY.vocab_size, (2, TINY.seq_len))
    counted = count_flops(lambda: model(idx, idx).backward())
    forward, total = gpt_step_flops(TINY, idx.numel())
    assert counted.total == total
    per_block = (total - 6 * TINY.vocab_size * TINY.n_embd * idx.numel()) // TINY.n_layer
    assert counted.per_module["blocks.1"] == per_block
    assert counted.per_module["blocks"] == TINY.n_layer * per_block   # a ModuleList: its blocks' sum
    flops, _, params = get_model_profile(model, args=(idx, idx), print_profile=False, as_string=False)
    assert flops == forward and params == sum(p.numel() for p in model.parameters())


def test_get_model_profile_prints_the_modules_and_returns_strings_by_default(capsys):
    flops, macs, params = get_model_profile(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()),
                                            input_shape=(4, 64), top_modules=1)
    assert (flops, macs, params) == ("32.77 K", "16.38 KMACs", "4.16 K")
    out = capsys.readouterr().out
    assert "forward FLOPs per rank:" in out and "0 (Linear): 32.77 K, 100.0%" in out


def test_the_engine_prints_the_profile_once_at_the_profile_step(capsys, tmp_path):
    torch.manual_seed(0)
    model = GPT(TINY)
    config = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "flops_profiler": {"enabled": True, "profile_step": 2, "module_depth": 1, "top_modules": 2,
                                 "output_file": str(tmp_path / "profile.txt")}}
    engine, *_ = zero.initialize(model=model, config=config)
    for _ in range(4):
        idx = torch.randint(0, TINY.vocab_size, (2, TINY.seq_len))
        engine.backward(engine(idx, idx))
        engine.step()
    text = (tmp_path / "profile.txt").read_text()
    forward, total = gpt_step_flops(TINY, 2 * TINY.seq_len)
    assert "FLOPs profile of step 2" in text
    assert f"step FLOPs per rank (forward + backward):    115.34 M ({total})" in text
    assert f"forward FLOPs per rank:" in text and f"({forward})" in text
    assert "depth 1: blocks 90.18 M, head 25.17 M" in text and "depth 2" not in text
    assert "FLOPs profile" not in capsys.readouterr().out
