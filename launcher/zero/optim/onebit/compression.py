"""1-bit compression with error feedback: the pure arithmetic of 1-bit Adam's momentum exchange.

Glossary: a *buffer* is one rank's flat momentum, padded so it splits into `world_size`
*chunks* of whole bytes of sign bits; rank j is the *server* of chunk j. Each side keeps an
*error* (what compression dropped last time) and adds it back before compressing again, so
the error does not accumulate. No communication here: `simulate_compressed_allreduce` runs
the whole exchange for a list of ranks in one process, the reference the distributed version
(counted_collectives.py) is tested against.
"""

import math

import torch

_BIT_WEIGHTS = (128, 64, 32, 16, 8, 4, 2, 1)


def padded_numel(numel: int, world_size: int) -> int:
    """Smallest length >= numel that splits into world_size chunks of whole sign bytes."""
    unit = 8 * world_size
    return max(unit, math.ceil(numel / unit) * unit)


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """Sign bits of x (x >= 0 -> 1, so 0 counts as +1), 8 per uint8; x.numel() % 8 == 0."""
    weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=x.device)
    bits = (x >= 0).to(torch.uint8).view(-1, 8)
    return (bits * weights).sum(dim=1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of pack_signs: a tensor of +1/-1 of length 8 * packed.numel()."""
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8, device=packed.device)
    bits = (packed.view(-1, 1) >> shifts) & 1
    return bits.view(-1).to(dtype) * 2 - 1


def scale_of(x: torch.Tensor) -> torch.Tensor:
    """The one scale that stands for x: its RMS, ||x||_2 / sqrt(numel) (a 0-dim tensor)."""
    return x.norm() / math.sqrt(x.numel())


def compress(x: torch.Tensor, error: torch.Tensor):
    """Compress x + error to (packed signs, scale); update error in place to what was lost."""
    corrected = x + error
    scale = scale_of(corrected)
    packed = pack_signs(corrected)
    error.copy_(corrected - scale * unpack_signs(packed, corrected.dtype))
    return packed, scale


def decompress(packed: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """The tensor a (packed signs, scale) pair stands for: scale * sign."""
    return scale.to(dtype) * unpack_signs(packed, dtype)


def server_reduce(signs_from_ranks, scales_from_ranks, server_error: torch.Tensor):
    """Average the ranks' compressed copies of one chunk, then compress the mean again.

    signs_from_ranks[i] is rank i's packed signs for this chunk, scales_from_ranks[i] its
    worker scale. Returns (packed, scale) of the averaged chunk; server_error is updated.
    """
    dtype = server_error.dtype
    total = torch.zeros_like(server_error)
    for packed, scale in zip(signs_from_ranks, scales_from_ranks):
        total += decompress(packed, scale, dtype)
    mean = total / len(signs_from_ranks)
    return compress(mean, server_error)


def simulate_compressed_allreduce(buffers, worker_errors, server_errors):
    """Run the compressed all-reduce for every rank in one process; returns the common result.

    buffers[r] is rank r's padded momentum, worker_errors[r] its padded-size worker error,
    server_errors[r] its chunk-size server error (both updated in place).
    """
    world_size = len(buffers)
    chunk_bytes = buffers[0].numel() // 8 // world_size
    compressed = [compress(b, e) for b, e in zip(buffers, worker_errors)]
    out_chunks = []
    for server in range(world_size):
        lo, hi = server * chunk_bytes, (server + 1) * chunk_bytes
        signs = [packed[lo:hi] for packed, _ in compressed]
        scales = [scale for _, scale in compressed]
        packed, scale = server_reduce(signs, scales, server_errors[server])
        out_chunks.append(decompress(packed, scale, buffers[0].dtype))
    return torch.cat(out_chunks)
