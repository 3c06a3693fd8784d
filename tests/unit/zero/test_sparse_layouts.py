"""Sparsity layouts against plain loop-by-loop statements of DeepSpeed's patterns."""

import pytest
import torch

from launcher.zero.sparse_attention import (BigBirdSparsityConfig, BSLongformerSparsityConfig, DenseSparsityConfig,
                                            FixedSparsityConfig, LocalSlidingWindowSparsityConfig, SparsityConfig,
                                            SparsityConfigError, VariableSparsityConfig)


def fixed_reference(n, local, glob, uni, horizontal, h=0, patterns=1):
    """Fixed: local windows; the chosen blocks of each window are global columns (and rows)."""
    out = torch.zeros(n, n, dtype=torch.int64)
    for r in range(n):
        for c in range(n):
            if r // local == c // local and (c <= r or not uni):
                out[r, c] = 1
    first = local - (1 + h % patterns) * glob
    starts = [w + first for w in range(0, n - n % local, local)]
    if n % local:
        starts.append(min(n - n % local + first, n - glob))
    for s in starts:
        for c in range(s, s + glob):
            for r in range(s if uni else 0, n):
                out[r, c] = 1
            if horizontal:
                out[c, :] = 1
    return out


@pytest.mark.parametrize("n,local,glob,uni,horizontal", [
    (8, 4, 1, False, False), (10, 4, 1, True, False), (10, 4, 2, False, True), (9, 3, 1, True, False),
    (3, 4, 1, False, False), (16, 8, 4, True, False),
])
def test_fixed_matches_the_pattern(n, local, glob, uni, horizontal):
    config = FixedSparsityConfig(num_heads=2, block=4, num_local_blocks=local, num_global_blocks=glob,
                                 attention="unidirectional" if uni else "bidirectional",
                                 horizontal_global_attention=horizontal)
    layout = config.make_layout(4 * n)
    assert layout.dtype == torch.int64 and layout.shape == (2, n, n)
    expected = fixed_reference(n, local, glob, uni, horizontal)
    assert torch.equal(layout[0], expected) and torch.equal(layout[1], expected)


def test_fixed_different_global_patterns_per_head():
    config = FixedSparsityConfig(num_heads=4, block=2, different_layout_per_head=True, num_local_blocks=4,
                                 num_different_global_patterns=4)
    layout = config.make_layout(2 * 12)
    for h in range(4):
        assert torch.equal(layout[h], fixed_reference(12, 4, 1, False, False, h=h, patterns=4))
    assert len({tuple(layout[h].flatten().tolist()) for h in range(4)}) == 4


def windows_reference(n, sizes):
    ids, start, i = [], 0, 0
    while start < n:
        size = sizes[min(i, len(sizes) - 1)]
        ids += [i] * size
        start, i = start + size, i + 1
    return ids[:n]


@pytest.mark.parametrize("uni", [False, True])
@pytest.mark.parametrize("ends", [None, [2, 7]])
def test_variable_without_random_blocks(uni, ends):
    n, sizes, starts = 11, [2, 3], [0, 5]
    config = VariableSparsityConfig(num_heads=1, block=1, local_window_blocks=sizes, global_block_indices=starts,
                                    global_block_end_indices=ends, horizontal_global_attention=not uni,
                                    attention="unidirectional" if uni else "bidirectional")
    ids = windows_reference(n, sizes)
    expected = torch.zeros(n, n, dtype=torch.int64)
    for r in range(n):
        for c in range(n):
            expected[r, c] = int(ids[r] == ids[c] and (c <= r or not uni))
    for s, e in zip(starts, ends or [s + 1 for s in starts]):
        for c in range(s, e):
            expected[s if uni else 0:, c] = 1
            if not uni:
                expected[c, :] = 1
    assert torch.equal(config.make_layout(n)[0], expected)


@pytest.mark.parametrize("uni", [False, True])
def test_bslongformer_and_bigbird_without_random_blocks(uni):
    n, window = 9, 3
    attention = "unidirectional" if uni else "bidirectional"
    expected = torch.zeros(n, n, dtype=torch.int64)
    for r in range(n):
        for c in range(n):
            expected[r, c] = int(abs(r - c) <= window // 2)
    longformer = expected.clone()
    longformer[[0, 4], :] = 1
    longformer[:, [0, 4]] = 1
    bigbird = expected.clone()
    bigbird[:2, :] = 1
    bigbird[:, :2] = 1
    if uni:
        longformer, bigbird = longformer.tril(), bigbird.tril()
    got = BSLongformerSparsityConfig(1, block=2, num_sliding_window_blocks=window, global_block_indices=[0, 4],
                                     attention=attention).make_layout(2 * n)[0]
    assert torch.equal(got, longformer)
    got = BigBirdSparsityConfig(1, block=2, num_random_blocks=0, num_sliding_window_blocks=window,
                                num_global_blocks=2, attention=attention).make_layout(2 * n)[0]
    assert torch.equal(got, bigbird)


def test_local_sliding_window_and_dense():
    layout = LocalSlidingWindowSparsityConfig(1, block=1, num_sliding_window_blocks=5).make_layout(6)[0]
    assert layout.tolist()[5] == [0, 0, 0, 1, 1, 1] and layout.tolist()[0] == [1, 0, 0, 0, 0, 0]
    assert DenseSparsityConfig(3, block=2).make_layout(8).sum() == 3 * 16


def test_random_blocks_are_seeded_causal_when_asked_and_per_head_when_asked():
    n = 32
    config = BigBirdSparsityConfig(4, block=1, num_random_blocks=3, num_sliding_window_blocks=1, num_global_blocks=1,
                                   attention="unidirectional", different_layout_per_head=True, seed=7)
    layout = config.make_layout(n)
    assert torch.equal(layout, layout.tril())
    assert torch.equal(layout, config.make_layout(n))  # the seed fixes it
    assert len({tuple(layout[h].flatten().tolist()) for h in range(4)}) == 4
    # every row beyond the first few gets 3 random blocks besides its diagonal and block 0
    assert (layout[0, 8:].sum(dim=1) >= 3).all() and (layout[0, 8:].sum(dim=1) <= 5).all()
    variable = VariableSparsityConfig(1, block=1, num_random_blocks=2, local_window_blocks=[1],
                                      global_block_indices=[], seed=3).make_layout(n)[0]
    assert (variable.sum(dim=1) >= 2).all() and (variable.sum(dim=1) <= 3).all()


@pytest.mark.parametrize("build,needle", [
    (lambda: FixedSparsityConfig(2, num_local_blocks=4, num_global_blocks=3), "divisible"),
    (lambda: FixedSparsityConfig(2, attention="causal"), "unidirectional"),
    (lambda: FixedSparsityConfig(2, attention="unidirectional", horizontal_global_attention=True), "bidirectional"),
    (lambda: FixedSparsityConfig(2, num_different_global_patterns=2), "different_layout_per_head"),
    (lambda: FixedSparsityConfig(2, different_layout_per_head=True, num_different_global_patterns=5), "exceed"),
    (lambda: VariableSparsityConfig(2, global_block_indices=[0, 3], global_block_end_indices=[2]), "must match"),
    (lambda: BSLongformerSparsityConfig(2, global_block_indices=[3], global_block_end_indices=[3]), "smaller"),
    (lambda: FixedSparsityConfig(2, block=16).make_layout(100), "divisible by the block size"),
    (lambda: BigBirdSparsityConfig(2, block=16, num_sliding_window_blocks=9).make_layout(64), "exceeds"),
    (lambda: SparsityConfig(2).make_layout(32), "does not define"),
])
def test_bad_parameters(build, needle):
    with pytest.raises((SparsityConfigError, NotImplementedError), match=needle):
        build()


def test_errors_are_value_errors_as_in_deepspeed():
    with pytest.raises(ValueError):
        FixedSparsityConfig(2, num_local_blocks=4, num_global_blocks=3)
