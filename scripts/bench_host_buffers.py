#!/usr/bin/env python3
"""The offload step's host side, per kind of page-locked host buffer (issue 43 item 1).

Since a00dc26 offload's large host buffers (fp32 masters, gradient buffers) are exact-size mapped
pages locked with cudaHostRegister (stages/host_memory.py); before, torch's caching pinned
allocator (cudaHostAlloc, blocks rounded up to a power of two). For each kind this times, over
``--numel`` values (the 406M GPT's by default): the gradients' copy device -> host and the weights'
copy host -> device in offload's 128 MiB pieces (GB/s), and one CPU Adam step reading the buffer
as gradient and stepping it as master (ms). Without CUDA only the Adam row runs (one kind).

    python3 scripts/bench_host_buffers.py [--numel 406380544] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--numel", type=int, default=406_380_544, help="values per buffer (the 406M GPT's)")
    p.add_argument("--repeat", type=int, default=3, help="timed repeats per figure (the median is printed)")
    return p.parse_args(argv)


def host_buffer(kind: str, numel: int):
    """A zeroed fp32 host buffer: 'exact' (host_memory.host_zeros) or 'torch' (torch's pinned allocator)."""
    import torch

    from launcher.zero.stages.host_memory import host_zeros

    if kind == "exact":
        return host_zeros(numel, torch.float32, pin=True)
    return torch.zeros(numel, dtype=torch.float32, pin_memory=torch.cuda.is_available())


def timed(fn, repeat: int) -> float:
    """The median seconds of ``repeat`` calls (after one untimed call)."""
    fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def copies(host, repeat: int) -> dict:
    """GB/s of device -> host and host -> device, in copy_in_pieces' pieces on a side stream."""
    import torch

    from launcher.zero.stages.placement import copy_in_pieces

    device = torch.empty(host.numel(), dtype=host.dtype, device="cuda")
    stream = torch.cuda.Stream()

    def run(target, source):
        with torch.cuda.stream(stream):
            copy_in_pieces(target, source)
        stream.synchronize()

    nbytes = host.numel() * host.element_size()
    d2h = timed(lambda: run(host, device), repeat)
    h2d = timed(lambda: run(device, host), repeat)
    del device
    return {"d2h_gb_s": round(nbytes / d2h / 1e9, 2), "h2d_gb_s": round(nbytes / h2d / 1e9, 2)}


def adam_step_ms(kind: str, numel: int, repeat: int) -> float:
    """One CPU Adam step over ``numel`` values whose master and gradient are buffers of ``kind``
    (Adam's moments are ordinary host memory, as in the engine)."""
    import torch

    from launcher.zero.optim.cpu_adam import CPUAdam

    master = torch.nn.Parameter(host_buffer(kind, numel))
    master.grad = host_buffer(kind, numel).fill_(1e-3)
    optimizer = CPUAdam([master], lr=1e-4, weight_decay=0.1)
    return round(timed(optimizer.step, repeat) * 1e3, 1)


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path[:0] = [REPO]
    import torch

    cuda = torch.cuda.is_available()
    kinds = ("exact", "torch") if cuda else ("torch",)
    for kind in kinds:
        host = host_buffer(kind, args.numel)
        record = {"kind": kind, "numel": args.numel, "pinned": bool(host.is_pinned()),
                  "device": torch.cuda.get_device_name(0) if cuda else "cpu", "threads": torch.get_num_threads()}
        if cuda:
            record.update(copies(host, args.repeat))
        del host
        record["adam_ms"] = adam_step_ms(kind, args.numel, args.repeat)
        print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
