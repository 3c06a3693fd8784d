"""The collectives 1-bit Adam uses, over one process group, with a count of the bytes sent.

Bytes are counted two ways from the tensors actually handed to torch.distributed:
`payload` is the size of what this rank contributes to each collective; `sent` is what it
puts on the wire under the usual algorithms (ring all-reduce 2(W-1)/W * B, pairwise
all-to-all (W-1)/W * B, ring all-gather (W-1) * B). The ratio of 1-bit to fp32 steps is
what the 1-bit Adam paper's "16x less volume" refers to.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist

from launcher.zero.optim.onebit.compression import compress, decompress, server_reduce, simulate_compressed_allreduce


@dataclass
class CommCounter:
    """Running byte totals of one rank; `snapshot()` and subtraction give per-step figures."""

    sent_bytes: int = 0
    payload_bytes: int = 0
    collectives: int = 0

    def snapshot(self) -> "CommCounter":
        return CommCounter(self.sent_bytes, self.payload_bytes, self.collectives)

    def since(self, earlier: "CommCounter") -> dict:
        return {
            "sent_bytes": self.sent_bytes - earlier.sent_bytes,
            "payload_bytes": self.payload_bytes - earlier.payload_bytes,
            "collectives": self.collectives - earlier.collectives,
        }


def allreduce_sent_bytes(nbytes: int, world_size: int) -> int:
    """Wire bytes one rank sends in a ring all-reduce of nbytes."""
    return 2 * (world_size - 1) * nbytes // world_size


class Collectives:
    """All-reduce-mean and the 1-bit compressed all-reduce over `group`, counting bytes."""

    def __init__(self, group=None, counter: CommCounter | None = None):
        self.group = group
        self.counter = counter if counter is not None else CommCounter()
        self.distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size(group) if self.distributed else 1
        self.rank = dist.get_rank(group) if self.distributed else 0

    def backend(self) -> str | None:
        return str(dist.get_backend(self.group)) if self.distributed else None

    def _count(self, payload: int, sent: int) -> None:
        self.counter.payload_bytes += payload
        self.counter.sent_bytes += sent
        self.counter.collectives += 1

    def all_reduce_mean(self, flat: torch.Tensor) -> None:
        """Average flat over the group in place, in full precision."""
        if self.world_size == 1:
            return
        nbytes = flat.numel() * flat.element_size()
        dist.all_reduce(flat, group=self.group)
        flat.div_(self.world_size)
        self._count(nbytes, allreduce_sent_bytes(nbytes, self.world_size))

    def _all_gather(self, tensor: torch.Tensor):
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(out, tensor, group=self.group)
        nbytes = tensor.numel() * tensor.element_size()
        self._count(nbytes, (self.world_size - 1) * nbytes)
        return out

    def compressed_allreduce(self, buffer, worker_error, server_error) -> torch.Tensor:
        """Average buffer over the group at 1 bit per element; returns the common result.

        buffer and worker_error have the padded length; server_error is this rank's chunk.
        """
        if self.world_size == 1:
            return simulate_compressed_allreduce([buffer], [worker_error], [server_error])
        world_size = self.world_size
        packed, scale = compress(buffer, worker_error)
        received = torch.empty_like(packed)
        dist.all_to_all_single(received, packed, group=self.group)
        self._count(packed.numel(), (world_size - 1) * packed.numel() // world_size)
        scales = self._all_gather(scale.reshape(1).to(buffer.dtype))
        signs = list(received.view(world_size, -1))
        server_packed, server_scale = server_reduce(signs, scales, server_error)
        all_packed = self._all_gather(server_packed)
        all_scales = self._all_gather(server_scale.reshape(1).to(buffer.dtype))
        return torch.cat([decompress(p, s[0], buffer.dtype) for p, s in zip(all_packed, all_scales)])
