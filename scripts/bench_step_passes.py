"""The step's passes over the master grads, before and after (stages/base.py, optim/step_factor.py).

    python scripts/bench_step_passes.py                    # 100M elements on the GPU if there is one
    python scripts/bench_step_passes.py --numel 20000000   # smaller, for a loaded CPU

Measures on one fp32 tensor of --numel elements:
- norm: the old square sum (float64 copies of 16M-element chunks) against the new one (float32
  norms of 1024-element rows, squared and summed in float64): median time, the largest single
  allocation it makes (bytes: a float64 copy shows here), and the relative error against a float64 sum;
- update: torch's fused AdamW step after a separate ``grad.mul_(factor)`` against the same step
  with the factor handed to the kernel as ``grad_scale``: median time.
Times: CUDA events on the GPU, perf_counter on the CPU; the variants alternate run by run.
Prints one JSON document.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from launcher.zero.optim.step_factor import factor_in_kernel  # noqa: E402
from launcher.zero.stages.base import square_sum  # noqa: E402

OLD_CHUNK = 1 << 24


def old_square_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The square sum before: float64 copies of OLD_CHUNK elements at a time."""
    flat = tensor.detach().reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=flat.device)
    for start in range(0, flat.numel(), OLD_CHUNK):
        total = total + torch.linalg.vector_norm(flat[start:start + OLD_CHUNK].double()).square()
    return total


def timed(fn, device) -> float:
    """Milliseconds one call of ``fn`` takes on ``device``."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    began = time.perf_counter()
    fn()
    return (time.perf_counter() - began) * 1e3


def largest_allocation(fn, device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base   # the peak of what it holds at once
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((event.self_cpu_memory_usage for event in prof.events()), default=0)


def alternate(variants: dict, repeats: int, device) -> dict:
    times = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            times[name].append(timed(fn, device))
    return {name: round(statistics.median(values), 3) for name, values in times.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--numel", type=int, default=100_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    grad = torch.randn(args.numel, device=device)
    exact = float(grad.double().square().sum())
    norm = {"time_ms": alternate({"old": lambda: old_square_sum(grad), "new": lambda: square_sum(grad)},
                                 args.repeats, device),
            "largest_allocation_bytes": {"old": largest_allocation(lambda: old_square_sum(grad), device),
                                         "new": largest_allocation(lambda: square_sum(grad), device)},
            "relative_error": {"old": abs(float(old_square_sum(grad)) / exact - 1),
                               "new": abs(float(square_sum(grad)) / exact - 1)}}
    del grad
    param = torch.nn.Parameter(torch.randn(args.numel, device=device))
    param.grad = torch.randn(args.numel, device=device)
    optimizer = torch.optim.AdamW([param], lr=1e-4, fused=True)
    optimizer.step()                     # state built outside the timing
    factor = torch.tensor(0.5, dtype=torch.float64, device=device)   # a device factor, as a sync-free step has

    def separate_pass():
        param.grad.mul_(factor)
        optimizer.step()

    def in_kernel():
        with factor_in_kernel(optimizer, factor, device):
            optimizer.step()

    update = {"time_ms": alternate({"separate_pass": separate_pass, "in_kernel": in_kernel}, args.repeats, device)}
    print(json.dumps({"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                      "torch": torch.__version__, "threads": torch.get_num_threads(), "numel": args.numel,
                      "norm": norm, "update": update}, indent=1))


if __name__ == "__main__":
    main()
