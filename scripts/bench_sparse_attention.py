"""Block-sparse attention (Fixed layout, flex_attention) against dense causal SDPA, forward+backward.

    python scripts/bench_sparse_attention.py                    # CUDA: seq 16384, bf16
    python scripts/bench_sparse_attention.py --tiny             # CPU smoke run (dense masked path)

Variants, timed side by side on the same q, k, v (batch, heads, seq, head_dim):
- sdpa_causal: F.scaled_dot_product_attention(is_causal=True) (flash attention on the GPU);
- sparse_fixed: SparseSelfAttention(FixedSparsityConfig(attention="unidirectional")), which on
  CUDA is torch.compile(flex_attention) with a BlockMask from the layout (causal inside blocks).
Each variant: `--warmup` untimed calls (the first includes compilation, reported as
first_call_ms), then the median of `--iters` timed forward+backward calls (CUDA events).
`check` compares the sparse output with SDPA under the same token mask. Prints one JSON document.
"""

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from launcher.zero.sparse_attention import FixedSparsityConfig, SparseSelfAttention, expand_layout  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-len", type=int, default=16384)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block", type=int, default=128, help="layout block; 128 matches flex_attention's tiles")
    p.add_argument("--num-local-blocks", type=int, default=4)
    p.add_argument("--num-global-blocks", type=int, default=1)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default=None, help="default bf16 on CUDA, fp32 on CPU")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--no-check", action="store_true", help="skip the comparison with masked SDPA")
    p.add_argument("--tiny", action="store_true", help="seq 256, 2 heads, head_dim 16, block 16: for CPU")
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    if args.tiny:
        args.seq_len, args.heads, args.head_dim, args.block = 256, 2, 16, 16
        args.warmup, args.iters = 1, 3
    return args


def timed(fn, device, warmup, iters):
    """first_call_ms (compilation included), then the median of iters calls."""
    cuda = device.type == "cuda"

    def once():
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    first = once()
    for _ in range(max(0, warmup - 1)):
        once()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    times = [once() for _ in range(iters)]
    out = {"first_call_ms": first, "median_ms": statistics.median(times), "min_ms": min(times)}
    if cuda:
        out["peak_bytes"] = torch.cuda.max_memory_allocated(device)
    return out


def forward_backward(attend, q, k, v, grad):
    def step():
        for t in (q, k, v):
            t.grad = None
        attend(q, k, v).backward(grad)
    return step


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype_name = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    shape = (args.batch_size, args.heads, args.seq_len, args.head_dim)
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v, grad = (torch.randn(shape, generator=gen, device=device, dtype=dtype) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    config = FixedSparsityConfig(args.heads, block=args.block, num_local_blocks=args.num_local_blocks,
                                 num_global_blocks=args.num_global_blocks, attention="unidirectional")
    sparse = SparseSelfAttention(config, max_seq_length=args.seq_len).to(device)
    layout = sparse.get_layout(args.seq_len)
    num_blocks = layout.shape[-1]
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "dtype": dtype_name, "shape_bhsd": list(shape),
        "layout": {"type": "Fixed", "block": args.block, "num_local_blocks": args.num_local_blocks,
                   "num_global_blocks": args.num_global_blocks, "attention": "unidirectional",
                   "blocks_kept": int(layout[0].sum()), "blocks_causal": num_blocks * (num_blocks + 1) // 2,
                   "density_vs_causal": float(layout[0].sum()) / (num_blocks * (num_blocks + 1) // 2)},
        "sparse_path": "flex_attention (compiled)" if device.type == "cuda" else "dense masked (CPU)",
        "results": {},
    }
    variants = {
        "sdpa_causal": lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
        "sparse_fixed": sparse,
    }
    for name, attend in variants.items():
        try:
            report["results"][name] = timed(forward_backward(attend, q, k, v, grad), device, args.warmup, args.iters)
        except Exception as exc:  # report, keep measuring the others
            report["results"][name] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0],
                                       "traceback": traceback.format_exc(limit=3)}
        if device.type == "cuda":
            torch.cuda.empty_cache()
    res = report["results"]
    if "median_ms" in res.get("sdpa_causal", {}) and "median_ms" in res.get("sparse_fixed", {}):
        report["speedup_sparse_over_sdpa_causal"] = res["sdpa_causal"]["median_ms"] / res["sparse_fixed"]["median_ms"]
    if not args.no_check:
        try:
            with torch.no_grad():
                mask = expand_layout(layout, args.block, causal=True)[0].to(device)
                ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                got = sparse(q, k, v)
            report["check"] = {"max_abs_diff_vs_masked_sdpa": float((got.float() - ref.float()).abs().max()),
                               "ref_abs_max": float(ref.float().abs().max())}
        except Exception as exc:
            report["check"] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
