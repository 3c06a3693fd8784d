#!/usr/bin/env python3
"""The GPU's two ceilings as PyTorch sees them: bf16 matrix rate and device copy bandwidth.

Prints one JSON line. Random data (zeros run faster), CUDA events, median of 10 after warm-up.
"""
from __future__ import annotations

import json
import statistics
import sys

import torch


def _time_ms(fn, repeats: int = 10, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> int:
    if not torch.cuda.is_available():
        print(json.dumps({"status": "unavailable", "reason": "no CUDA device"}))
        return 0
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    matmul_ms = _time_ms(lambda: a @ b)
    src = torch.randn(2**30 // 4, device="cuda")  # 1 GiB of fp32
    dst = torch.empty_like(src)
    copy_ms = _time_ms(lambda: dst.copy_(src))
    print(json.dumps({
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "bf16_matmul_tflops": round(2 * n**3 / matmul_ms / 1e9, 1),
        "copy_tb_per_s": round(2 * src.numel() * 4 / copy_ms / 1e9, 2),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
