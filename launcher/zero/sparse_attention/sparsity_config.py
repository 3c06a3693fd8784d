"""Block-sparse attention layouts with DeepSpeed's classes, parameters and patterns.

A *layout* is an int64 tensor (num_heads, num_blocks, num_blocks): layout[h, i, j] = 1 when
the queries of block i may attend to the keys of block j (a block is `block` tokens). Heads
share the first head's layout unless `different_layout_per_head`. Random blocks come from
torch's RNG (seed it, or pass `seed`); SparseSelfAttention broadcasts the layout from rank 0
so every rank uses the same one, as DeepSpeed does.
"""

import torch

from launcher.zero.errors import ConfigError

ATTENTION_TYPES = ("unidirectional", "bidirectional")


class SparsityConfigError(ConfigError, ValueError):
    """A bad sparsity pattern parameter (a ValueError too, as DeepSpeed raises)."""


def _check_attention(attention):
    if attention not in ATTENTION_TYPES:
        raise SparsityConfigError(f"attention must be 'unidirectional' or 'bidirectional', got {attention!r}")


def _check_global_ranges(starts, ends):
    if ends is None:
        return
    if len(starts) != len(ends):
        raise SparsityConfigError(f"global_block_indices has {len(starts)} entries but global_block_end_indices "
                                  f"has {len(ends)}: they must match")
    for start, end in zip(starts, ends):
        if start >= end:
            raise SparsityConfigError(f"global block start index {start} must be smaller than its end index {end}")


def _global_ranges(starts, ends, num_blocks):
    """[start, end) block ranges of global attention that fall inside the sequence."""
    if ends is None:
        ends = [s + 1 for s in starts]
    return [(s, min(e, num_blocks)) for s, e in zip(starts, ends) if s < num_blocks]


class SparsityConfig:
    """What every pattern shares: heads, block size, and whether heads differ."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False, seed=None):
        if num_heads < 1 or block < 1:
            raise SparsityConfigError(f"num_heads and block must be >= 1, got {num_heads} and {block}")
        self.num_heads = num_heads
        self.block = block
        self.different_layout_per_head = different_layout_per_head
        self.num_layout_heads = num_heads if different_layout_per_head else 1
        self.seed = seed
        self.attention = "bidirectional"   # the patterns that take attention= set theirs after this

    def num_blocks(self, seq_len: int) -> int:
        if seq_len % self.block != 0:
            raise SparsityConfigError(f"sequence length {seq_len} must be divisible by the block size {self.block}")
        return seq_len // self.block

    def setup_layout(self, seq_len):
        """An all-zero layout for seq_len tokens."""
        n = self.num_blocks(seq_len)
        return torch.zeros((self.num_heads, n, n), dtype=torch.int64)

    def check_and_propagate_first_head_layout(self, layout):
        if not self.different_layout_per_head:
            layout[1:] = layout[0]
        return layout

    def head_layout(self, h, num_blocks, generator):
        """The (num_blocks, num_blocks) bool layout of head h; each pattern defines it."""
        raise NotImplementedError(f"{type(self).__name__} does not define a pattern; use one of its subclasses")

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        generator = torch.Generator().manual_seed(self.seed) if self.seed is not None else None
        for h in range(self.num_layout_heads):
            layout[h] = self.head_layout(h, layout.shape[1], generator).to(torch.int64)
        return self.check_and_propagate_first_head_layout(layout)


def _grid(n):
    idx = torch.arange(n)
    return idx[:, None], idx[None, :]


def _random_blocks(n, count, generator, causal):
    """count random columns per row (from the columns <= row when causal), without repeats."""
    out = torch.zeros(n, n, dtype=torch.bool)
    if count == 0:
        return out
    rows, cols = _grid(n)
    keys = torch.rand(n, n, generator=generator)
    if causal:
        keys = keys.masked_fill(cols > rows, 2.0)
    picked = keys.argsort(dim=1)[:, :count]
    out.scatter_(1, picked, True)
    if causal:
        out &= cols <= rows
    return out


def _sliding_window(n, width):
    rows, cols = _grid(n)
    return (cols - rows).abs() <= width // 2


class DenseSparsityConfig(SparsityConfig):
    """Every block: dense attention in the block-sparse format, for comparison."""

    def head_layout(self, h, num_blocks, generator):
        return torch.ones(num_blocks, num_blocks, dtype=torch.bool)


class FixedSparsityConfig(SparsityConfig):
    """`Fixed` pattern of Sparse Transformers (arXiv 1904.10509), as customized by DeepSpeed:
    local windows of num_local_blocks, plus the last num_global_blocks of each window as global."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_local_blocks=4, num_global_blocks=1,
                 attention="bidirectional", horizontal_global_attention=False, num_different_global_patterns=1,
                 seed=None):
        super().__init__(num_heads, block, different_layout_per_head, seed)
        if num_global_blocks < 1 or num_local_blocks % num_global_blocks != 0:
            raise SparsityConfigError(f"num_local_blocks ({num_local_blocks}) must be divisible by "
                                      f"num_global_blocks ({num_global_blocks})")
        _check_attention(attention)
        if attention != "bidirectional" and horizontal_global_attention:
            raise SparsityConfigError("horizontal_global_attention needs bidirectional attention")
        if num_different_global_patterns > 1 and not different_layout_per_head:
            raise SparsityConfigError("num_different_global_patterns > 1 needs different_layout_per_head=True")
        if num_different_global_patterns > num_local_blocks // num_global_blocks:
            raise SparsityConfigError(f"num_different_global_patterns ({num_different_global_patterns}) cannot exceed "
                                      f"num_local_blocks / num_global_blocks = {num_local_blocks // num_global_blocks}")
        self.num_local_blocks = num_local_blocks
        self.num_global_blocks = num_global_blocks
        self.attention = attention
        self.horizontal_global_attention = horizontal_global_attention
        self.num_different_global_patterns = num_different_global_patterns

    def global_starts(self, h, n):
        """First block of every global range of head h (the last in a short final window)."""
        first = self.num_local_blocks - (1 + h % self.num_different_global_patterns) * self.num_global_blocks
        full_end = n - n % self.num_local_blocks
        starts = list(range(first, full_end, self.num_local_blocks))
        if full_end < n:
            starts.append(min(full_end + first, n - self.num_global_blocks))
        return starts

    def head_layout(self, h, n, generator):
        rows, cols = _grid(n)
        out = rows // self.num_local_blocks == cols // self.num_local_blocks
        if self.attention == "unidirectional":
            out &= cols <= rows
        for start in self.global_starts(h, n):
            end = start + self.num_global_blocks
            out[0 if self.attention == "bidirectional" else start:, start:end] = True
            if self.horizontal_global_attention:
                out[start:end, :] = True
        return out


class VariableSparsityConfig(SparsityConfig):
    """Fixed, generalized: random blocks, a list of local window sizes, chosen global blocks."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_random_blocks=0,
                 local_window_blocks=(4,), global_block_indices=(0,), global_block_end_indices=None,
                 attention="bidirectional", horizontal_global_attention=False, seed=None):
        super().__init__(num_heads, block, different_layout_per_head, seed)
        _check_global_ranges(global_block_indices, global_block_end_indices)
        _check_attention(attention)
        if attention != "bidirectional" and horizontal_global_attention:
            raise SparsityConfigError("horizontal_global_attention needs bidirectional attention")
        if not local_window_blocks or min(local_window_blocks) < 1:
            raise SparsityConfigError(f"local_window_blocks must be sizes >= 1, got {local_window_blocks}")
        self.num_random_blocks = num_random_blocks
        self.local_window_blocks = list(local_window_blocks)
        self.global_block_indices = list(global_block_indices)
        self.global_block_end_indices = None if global_block_end_indices is None else list(global_block_end_indices)
        self.attention = attention
        self.horizontal_global_attention = horizontal_global_attention

    def window_ids(self, n):
        """For every block, the index of the local window it belongs to."""
        ids, start, window = [], 0, 0
        sizes = iter(self.local_window_blocks)
        size = self.local_window_blocks[-1]
        while start < n:
            size = next(sizes, size)  # the last size repeats for the rest of the sequence
            ids += [window] * min(size, n - start)
            start, window = start + size, window + 1
        return torch.tensor(ids)

    def head_layout(self, h, n, generator):
        if n < self.num_random_blocks:
            raise SparsityConfigError(f"num_random_blocks ({self.num_random_blocks}) exceeds the {n} blocks in a row")
        rows, cols = _grid(n)
        window = self.window_ids(n)
        local = window[:, None] == window[None, :]
        if self.attention == "unidirectional":
            local &= cols <= rows
        # DeepSpeed draws Variable's random blocks from the whole row, whatever the attention.
        out = _random_blocks(n, self.num_random_blocks, generator, causal=False) | local
        for start, end in _global_ranges(self.global_block_indices, self.global_block_end_indices, n):
            if self.horizontal_global_attention:
                out[start:end, :] = True
            out[0 if self.attention == "bidirectional" else start:, start:end] = True
        return out


class BigBirdSparsityConfig(SparsityConfig):
    """BigBird (arXiv 2007.14062): random blocks, a sliding window and the first blocks global."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_random_blocks=1,
                 num_sliding_window_blocks=3, num_global_blocks=1, attention="bidirectional", seed=None):
        super().__init__(num_heads, block, different_layout_per_head, seed)
        _check_attention(attention)
        self.num_random_blocks = num_random_blocks
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.num_global_blocks = num_global_blocks
        self.attention = attention

    def head_layout(self, h, n, generator):
        for name in ("num_random_blocks", "num_sliding_window_blocks", "num_global_blocks"):
            if n < getattr(self, name):
                raise SparsityConfigError(f"{name} ({getattr(self, name)}) exceeds the {n} blocks in a row")
        causal = self.attention == "unidirectional"
        out = _random_blocks(n, self.num_random_blocks, generator, causal)
        out |= _sliding_window(n, self.num_sliding_window_blocks)
        out[: self.num_global_blocks, :] = True
        out[:, : self.num_global_blocks] = True
        return out.tril() if causal else out


class BSLongformerSparsityConfig(SparsityConfig):
    """Block-sparse Longformer (arXiv 2004.05150): a sliding window plus chosen global blocks."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_sliding_window_blocks=3,
                 global_block_indices=(0,), global_block_end_indices=None, attention="bidirectional", seed=None):
        super().__init__(num_heads, block, different_layout_per_head, seed)
        _check_global_ranges(global_block_indices, global_block_end_indices)
        _check_attention(attention)
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.global_block_indices = list(global_block_indices)
        self.global_block_end_indices = None if global_block_end_indices is None else list(global_block_end_indices)
        self.attention = attention

    def head_layout(self, h, n, generator):
        if n < self.num_sliding_window_blocks:
            raise SparsityConfigError(f"num_sliding_window_blocks ({self.num_sliding_window_blocks}) exceeds "
                                      f"the {n} blocks in a row")
        out = _sliding_window(n, self.num_sliding_window_blocks)
        for start, end in _global_ranges(self.global_block_indices, self.global_block_end_indices, n):
            out[start:end, :] = True
            out[:, start:end] = True
        return out.tril() if self.attention == "unidirectional" else out


class LocalSlidingWindowSparsityConfig(SparsityConfig):
    """A purely local sliding window (causal by default)."""

    def __init__(self, num_heads, block=16, num_sliding_window_blocks=3, attention="unidirectional", seed=None):
        super().__init__(num_heads, block, False, seed)
        _check_attention(attention)
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.attention = attention

    def head_layout(self, h, n, generator):
        out = _sliding_window(n, self.num_sliding_window_blocks)
        return out.tril() if self.attention == "unidirectional" else out
