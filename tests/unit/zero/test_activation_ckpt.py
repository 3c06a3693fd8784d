"""Activation checkpointing: same gradients as without, DeepSpeed's configure semantics."""

import pytest
import torch
import torch.nn as nn

from launcher.errors import ConfigError
from launcher.zero import checkpointing


class Block(nn.Module):
    def __init__(self, width, dropout=0.0):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x + self.drop(self.out(torch.nn.functional.gelu(self.fc(self.norm(x)))))


class Tiny(nn.Module):
    def __init__(self, width=8, layers=3, dropout=0.0):
        super().__init__()
        self.embed = nn.Linear(4, width)
        self.blocks = nn.ModuleList(Block(width, dropout) for _ in range(layers))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x).pow(2).mean()


@pytest.fixture(autouse=True)
def fresh():
    checkpointing.reset()
    yield
    checkpointing.reset()


def grads_of(model, x, seed=0):
    model.zero_grad()
    torch.manual_seed(seed)
    model(x).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("cpu_checkpointing", [False, True])
def test_checkpoint_blocks_gives_the_same_gradients(dropout, cpu_checkpointing):
    checkpointing.configure(None, checkpoint_in_cpu=cpu_checkpointing)
    torch.manual_seed(0)
    model = Tiny(dropout=dropout)
    x = torch.randn(5, 4)
    plain = grads_of(model, x)
    keys = list(model.state_dict())
    assert len(checkpointing.checkpoint_blocks(model)) == 3
    checkpointed = grads_of(model, x)
    assert list(model.state_dict()) == keys and isinstance(model.blocks[0], Block)
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=0, atol=0)


def test_checkpointed_block_recomputes_its_forward_in_backward():
    model = Tiny()
    checkpointing.checkpoint_blocks(model)
    model(torch.randn(2, 4)).backward()
    assert [b.calls for b in model.blocks] == [2, 2, 2]
    with torch.no_grad():
        model(torch.randn(2, 4))
    assert [b.calls for b in model.blocks] == [3, 3, 3]
    checkpointing.uncheckpoint_blocks(model)
    model(torch.randn(2, 4)).backward()
    assert [b.calls for b in model.blocks] == [4, 4, 4] and type(model.blocks[0]) is Block


def test_checkpoint_function_matches_direct_call():
    torch.manual_seed(0)
    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(2, 3, requires_grad=True)

    def fn(a, b):
        return torch.tanh(a @ w) * b, a.sum()

    direct = sum(t.sum() for t in fn(x, 2.0))
    gw, gx = torch.autograd.grad(direct, (w, x))
    out = checkpointing.checkpoint(fn, x, 2.0)
    gw2, gx2 = torch.autograd.grad(sum(t.sum() for t in out), (w, x))
    torch.testing.assert_close(gw2, gw)
    torch.testing.assert_close(gx2, gx)


def test_configure_reads_deepspeed_keys_and_explicit_arguments_win():
    config = {"activation_checkpointing": {"partition_activations": True, "cpu_checkpointing": True,
                                           "contiguous_memory_optimization": True, "number_checkpoints": 4,
                                           "synchronize_checkpoint_boundary": True, "profile": False}}
    checkpointing.configure(None, deepspeed_config=config, profile=True, synchronize=False)
    assert checkpointing.is_configured()
    assert checkpointing.current_options() == checkpointing.CheckpointingOptions(
        partition_activations=True, contiguous_checkpointing=True, num_checkpoints=4,
        checkpoint_in_cpu=True, synchronize=False, profile=True)


@pytest.mark.parametrize("kwargs,needle", [
    ({"contiguous_checkpointing": True, "num_checkpoints": 2}, "needs partition_activations"),
    ({"contiguous_checkpointing": True, "partition_activations": True}, "needs number_checkpoints"),
])
def test_contiguous_buffers_need_partitioning_and_a_count(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        checkpointing.configure(None, **kwargs)


def test_partitioning_across_model_parallel_ranks_is_refused():
    class MPU:
        def get_model_parallel_world_size(self):
            return 2

    checkpointing.configure(MPU(), partition_activations=False)
    checkpointing.configure(None, partition_activations=True)  # no model parallelism: accepted
    with pytest.raises(ConfigError, match="model-parallel"):
        checkpointing.configure(MPU(), partition_activations=True)


def test_profile_counts_checkpointed_forwards():
    checkpointing.configure(None, profile=True)
    model = Tiny(layers=2)
    checkpointing.checkpoint_blocks(model)
    model(torch.randn(2, 4)).backward()
    stats = checkpointing.profile_stats()
    assert stats["calls"] == 2 and stats["forward_seconds"] > 0


def test_checkpoint_blocks_needs_blocks():
    with pytest.raises(ConfigError, match="no ModuleList"):
        checkpointing.checkpoint_blocks(nn.Linear(2, 2))
    seq = nn.Sequential(Block(4), Block(4))
    assert len(checkpointing.checkpoint_blocks(seq)) == 2
    assert checkpointing.checkpoint_blocks(seq) == []  # already done


def lm_pieces(seed=0, tokens=24, width=6, vocab=50):
    torch.manual_seed(seed)
    head = nn.Linear(width, vocab, bias=False)
    hidden = torch.randn(2, tokens // 2, width, requires_grad=True)
    targets = torch.randint(vocab, (2, tokens // 2))
    return head, hidden, targets


def loss_sum_of(head, calls=None):
    def loss_sum(h, t):
        if calls is not None:
            calls.append(h.shape[0])
        return torch.nn.functional.cross_entropy(head(h).float(), t, reduction="sum")
    return loss_sum


@pytest.mark.parametrize("chunks", [1, 3, 5, 24])
def test_chunked_loss_equals_the_whole_mean_loss_and_its_gradients(chunks):
    head, hidden, targets = lm_pieces()
    whole = torch.nn.functional.cross_entropy(head(hidden).view(-1, 50), targets.view(-1))
    whole.backward()
    expected = (hidden.grad.clone(), head.weight.grad.clone())
    hidden.grad, head.weight.grad = None, None
    chunked = checkpointing.chunked_loss(loss_sum_of(head), hidden, targets, chunks)
    chunked.backward()
    assert torch.allclose(chunked, whole, atol=1e-6)
    assert torch.allclose(hidden.grad, expected[0], atol=1e-6)
    assert torch.allclose(head.weight.grad, expected[1], atol=1e-6)


def test_chunked_loss_keeps_no_logits_for_backward_and_recomputes_each_piece():
    head, hidden, targets = lm_pieces(tokens=40, vocab=1000)
    saved = []
    calls = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        loss = checkpointing.chunked_loss(loss_sum_of(head, calls), hidden, targets, 4)
    assert calls == [10, 10, 10, 10]
    assert max(saved) < 10 * 1000  # not even one piece's logits: only the pieces' inputs
    loss.backward()
    assert calls == [10] * 8  # each piece ran again in backward


@pytest.mark.parametrize("chunks, words", [(0, "chunks >= 1"), (-2, "chunks >= 1")])
def test_chunked_loss_refuses_bad_chunks(chunks, words):
    head, hidden, targets = lm_pieces()
    with pytest.raises(ConfigError, match=words):
        checkpointing.chunked_loss(loss_sum_of(head), hidden, targets, chunks)


def test_chunked_loss_names_a_shape_mismatch():
    head, hidden, targets = lm_pieces()
    with pytest.raises(ConfigError, match="24 hidden rows but 12 targets"):
        checkpointing.chunked_loss(loss_sum_of(head), hidden, targets[:, :6], 2)
