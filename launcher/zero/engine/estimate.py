"""How much memory model states need, per ZeRO stage and offload choice.

Model states are parameters, gradients, fp32 master weights and Adam's two moments;
activations and temporary buffers are not counted. The figures follow DeepSpeed's
own estimators (`estimate_zero2_model_states_mem_needs`,
`estimate_zero3_model_states_mem_needs`), which count mixed-precision Adam as
  2 bytes 16-bit params + 2 bytes 16-bit grads + 16 bytes partitionable fp32 state
  (4 fp32 grads + 4 fp32 master weights + 8 Adam moments),
and, on the CPU, the fp32 copy every process of a node loads before partitioning,
times `additional_buffer_factor` (1.5). Stages 0 and 1 are not covered by DeepSpeed's
functions; they use the same per-byte accounting (stage 0 keeps all of it on every
device, stage 1 partitions only the 16 fp32 bytes).

``engine="dslaunch"`` gives this engine's own figures where they differ: stage 3's optimizer
offload keeps the gradients on the device until the CPU Adam takes them a chunk at a time
(stages/grad_feed.py), so the host holds the fp32 master and Adam's two moments, 12 bytes a
parameter instead of 16, and the device holds the gradient shard (2 bytes) beside the 16-bit
one. ``offload_optimizer.overlap_step`` keeps host gradient buffers: DeepSpeed's figures apply.
Its figures also have stage 3 rows with ``offload_param=nvme`` (DeepSpeed's estimators have none):
the parameter shards live in files, so the host holds the optimizer offload's states and only the
parameters' staging buffers, ``buffer_count`` x ``buffer_size`` 16-bit elements per process at
the config's defaults (``NVME_PARAM_STAGING_BYTES``); the device holds what it holds with
``offload_param=cpu``.

This module is pure arithmetic and imports torch only when handed a model.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, asdict

from launcher.errors import ConfigError, DslaunchError, UsageError

BYTES_PARAM_16BIT = 2
BYTES_GRAD_16BIT = 2
BYTES_FP32_STATE = 16   # fp32 grads 4 + fp32 master 4 + Adam exp_avg 4 + exp_avg_sq 4
BYTES_FP32_LOAD = 4     # each process's fp32 copy of the model before it is partitioned
BYTES_FED_HOST_STATE = 12   # stage 3 offload with fed gradients: fp32 master 4 + Adam moments 8
ENGINES = ("deepspeed", "dslaunch")
#: offload_param nvme: host bytes per process of its staging buffers (4 x 1e8 16-bit elements: the
#: config's buffer_count and buffer_size defaults)
NVME_PARAM_STAGING_BYTES = 4 * 100_000_000 * BYTES_PARAM_16BIT
GIB = 2 ** 30


@dataclass(frozen=True)
class Estimate:
    """One row: a stage with an offload choice and what it needs."""

    stage: int
    offload_optimizer: bool
    offload_param: bool
    zero_init: bool
    gpu_bytes_per_device: int
    cpu_bytes_per_node: int
    param_nvme: bool = False   # offload_param's device is nvme (dslaunch's figures only)

    def options(self) -> str:
        parts = [f"stage={self.stage}",
                 f"offload_optimizer={'cpu' if self.offload_optimizer else 'none'}"]
        if self.stage == 3:
            where = "nvme" if self.param_nvme else "cpu" if self.offload_param else "none"
            parts.append(f"offload_param={where}")
            parts.append(f"zero_init={int(self.zero_init)}")
        return ", ".join(parts)


@dataclass(frozen=True)
class MemoryReport:
    """All rows for one model on one cluster shape."""

    total_params: int
    largest_layer_params: int
    largest_layer_assumed: bool
    num_gpus_per_node: int
    num_nodes: int
    additional_buffer_factor: float
    rows: tuple
    engine: str = "deepspeed"   # whose figures: DeepSpeed's estimators or dslaunch's engine

    def row(self, stage: int, offload_optimizer: bool = False, offload_param: bool = False,
            zero_init: bool = True, param_nvme: bool = False) -> Estimate:
        """The row for one configuration (zero_init matters at stage 3 only)."""
        for r in self.rows:
            if (r.stage, r.offload_optimizer, r.offload_param, r.param_nvme) == \
                    (stage, offload_optimizer, offload_param, param_nvme) and (stage != 3 or r.zero_init == zero_init):
                return r
        raise ConfigError(f"no estimate for stage {stage} with offload_optimizer={offload_optimizer}, "
                          f"offload_param={offload_param}",
                          hint="offload_param exists at stage 3 only; offload_optimizer at stages 1-3")

    def to_dict(self) -> dict:
        out = asdict(self)
        out["rows"] = [asdict(r) for r in self.rows]
        return out


def zero2_needs(total_params: int, num_gpus_per_node: int, num_nodes: int, cpu_offload: bool,
                additional_buffer_factor: float = 1.5) -> tuple[int, int]:
    """(cpu_bytes_per_node, gpu_bytes_per_device) as DeepSpeed's ZeRO-2 estimator computes them."""
    world_size = num_gpus_per_node * num_nodes
    if cpu_offload:
        gpu = BYTES_PARAM_16BIT * total_params
        cpu = total_params * max(BYTES_FP32_LOAD * world_size, BYTES_FP32_STATE) * additional_buffer_factor
    else:
        gpu = BYTES_PARAM_16BIT * total_params + int((BYTES_GRAD_16BIT + BYTES_FP32_STATE) * total_params / world_size)
        cpu = total_params * BYTES_FP32_LOAD * num_gpus_per_node * additional_buffer_factor
    return int(cpu), int(gpu)


def zero3_needs(total_params: int, largest_layer_params: int, num_gpus_per_node: int, num_nodes: int,
                cpu_offload: bool, cpu_offload_params: bool, zero_init: bool,
                additional_buffer_factor: float = 1.5, fed_grads: bool = False) -> tuple[int, int]:
    """(cpu_bytes_per_node, gpu_bytes_per_device) as DeepSpeed's ZeRO-3 estimator computes them.

    The largest layer is gathered whole in fp32-sized buffers (4 bytes per parameter).
    ``fed_grads`` (this engine's optimizer offload): the host keeps 12 bytes of fp32 state per
    parameter, not 16, and the device keeps the 16-bit gradient shard.
    """
    world_size = num_gpus_per_node * num_nodes
    per_node = 1 / num_nodes
    largest_layer = BYTES_FP32_LOAD * largest_layer_params
    state = BYTES_FED_HOST_STATE if fed_grads and cpu_offload else BYTES_FP32_STATE
    full = BYTES_PARAM_16BIT + state   # DeepSpeed's 18: the 16-bit shard and its fp32 state
    grad_shard = int(BYTES_GRAD_16BIT * total_params / world_size) if fed_grads and cpu_offload else 0
    if cpu_offload and cpu_offload_params:
        gpu = largest_layer + grad_shard
        resident = full * per_node
    elif cpu_offload:
        gpu = largest_layer + int(BYTES_PARAM_16BIT * total_params / world_size) + grad_shard
        resident = state * per_node
    else:
        gpu = largest_layer + int(full * total_params / world_size)
        load = largest_layer_params if zero_init else total_params
        return int(load * BYTES_FP32_LOAD * num_gpus_per_node * additional_buffer_factor), int(gpu)
    factor = resident if zero_init else max(BYTES_FP32_LOAD * num_gpus_per_node, resident)
    return int(total_params * factor * additional_buffer_factor), int(gpu)


def _stage01_needs(stage: int, total_params: int, num_gpus_per_node: int, num_nodes: int, cpu_offload: bool,
                   additional_buffer_factor: float) -> tuple[int, int]:
    """Stages 0 and 1 with DeepSpeed's per-byte accounting (16-bit grads stay whole on every device)."""
    world_size = num_gpus_per_node * num_nodes
    whole = BYTES_PARAM_16BIT + BYTES_GRAD_16BIT
    if cpu_offload:   # stage 1 only: fp32 state on the host, as ZeRO-2's offload row
        cpu = total_params * max(BYTES_FP32_LOAD * world_size, BYTES_FP32_STATE) * additional_buffer_factor
        return int(cpu), whole * total_params
    partitions = world_size if stage == 1 else 1
    gpu = whole * total_params + int(BYTES_FP32_STATE * total_params / partitions)
    cpu = total_params * BYTES_FP32_LOAD * num_gpus_per_node * additional_buffer_factor
    return int(cpu), int(gpu)


def assumed_largest_layer(total_params: int) -> int:
    """A GPT-shaped guess when only the total is known: 12*L*h^2 params with L = h/64, largest layer 4*h^2."""
    hidden = (64 * total_params / 12) ** (1 / 3)
    return min(total_params, int(4 * hidden * hidden))


def count_params(model) -> tuple[int, int]:
    """(total, largest layer) of an nn.Module; shared parameters counted once, meta tensors fine."""
    seen = {}
    for p in model.parameters():
        seen[id(p)] = _numel(p)
    largest = 0
    for module in model.modules():
        largest = max(largest, sum(_numel(p) for p in module.parameters(recurse=False)))
    return sum(seen.values()), largest


def _numel(p) -> int:
    full = getattr(p, "ds_numel", None)   # a stage-3 partitioned parameter reports its full size
    return int(full) if full is not None else p.numel()


def estimate_memory(model_or_num_params, num_gpus_per_node: int = 1, num_nodes: int = 1,
                    largest_layer_params: int | None = None,
                    additional_buffer_factor: float = 1.5, engine: str = "deepspeed") -> MemoryReport:
    """Memory that model states need at every ZeRO stage, with and without CPU offload.

    `model_or_num_params` is an nn.Module (counted, may be on the meta device) or a number;
    `engine` "deepspeed" (DeepSpeed's estimators) or "dslaunch" (this engine, see the module doc).
    """
    if engine not in ENGINES:
        raise UsageError(f"engine {engine!r} is not one of {', '.join(ENGINES)}")
    if isinstance(model_or_num_params, (int, float)):
        total = int(model_or_num_params)
        assumed = largest_layer_params is None
        largest = assumed_largest_layer(total) if assumed else int(largest_layer_params)
    else:
        total, counted = count_params(model_or_num_params)
        largest = counted if largest_layer_params is None else int(largest_layer_params)
        assumed = False
    _check_shape(total, largest, num_gpus_per_node, num_nodes, additional_buffer_factor)
    rows = []
    for stage in (0, 1):
        for offload in ((False,) if stage == 0 else (False, True)):
            cpu, gpu = _stage01_needs(stage, total, num_gpus_per_node, num_nodes, offload, additional_buffer_factor)
            rows.append(Estimate(stage, offload, False, False, gpu, cpu))
    for offload in (False, True):
        cpu, gpu = zero2_needs(total, num_gpus_per_node, num_nodes, offload, additional_buffer_factor)
        rows.append(Estimate(2, offload, False, False, gpu, cpu))
    for offload, offload_param in ((False, False), (True, False), (True, True)):
        for zero_init in (True, False):
            cpu, gpu = zero3_needs(total, largest, num_gpus_per_node, num_nodes, offload, offload_param,
                                   zero_init, additional_buffer_factor, fed_grads=engine == "dslaunch")
            rows.append(Estimate(3, offload, offload_param, zero_init, gpu, cpu))
    if engine == "dslaunch":   # offload_param nvme: the host keeps the states and the staging buffers only
        for zero_init in (True, False):
            cpu, _ = zero3_needs(total, largest, num_gpus_per_node, num_nodes, True, False, zero_init,
                                 additional_buffer_factor, fed_grads=True)
            _, gpu = zero3_needs(total, largest, num_gpus_per_node, num_nodes, True, True, zero_init,
                                 additional_buffer_factor, fed_grads=True)
            rows.append(Estimate(3, True, True, zero_init, gpu, cpu + num_gpus_per_node * NVME_PARAM_STAGING_BYTES,
                                 param_nvme=True))
    return MemoryReport(total, largest, assumed, num_gpus_per_node, num_nodes,
                        additional_buffer_factor, tuple(rows), engine)


def _check_shape(total, largest, num_gpus_per_node, num_nodes, factor) -> None:
    if total < 1:
        raise UsageError(f"the model has {total} parameters", hint="give --params as a positive number, e.g. 1.5e9")
    if not 0 <= largest <= total:
        raise UsageError(f"largest layer ({largest}) must be between 0 and the total ({total})")
    if num_gpus_per_node < 1 or num_nodes < 1:
        raise UsageError(f"num_gpus_per_node={num_gpus_per_node}, num_nodes={num_nodes}: both must be >= 1")
    if factor <= 0:
        raise UsageError(f"additional_buffer_factor must be > 0, got {factor}")


def fitting_configs(report: MemoryReport, gpu_bytes: int, cpu_bytes: int | None = None) -> list:
    """Rows whose needs fit `gpu_bytes` per device (and `cpu_bytes` per node when given), least offload first."""
    fits = [r for r in report.rows if r.gpu_bytes_per_device <= gpu_bytes
            and (cpu_bytes is None or r.cpu_bytes_per_node <= cpu_bytes)]
    return sorted(fits, key=lambda r: (r.offload_param, r.param_nvme, r.offload_optimizer, r.stage, not r.zero_init))


def out_of_memory_hint(report: MemoryReport, stage: int, offload_optimizer: bool, offload_param: bool,
                       gpu_bytes: int, cpu_bytes: int | None = None, param_nvme: bool = False) -> str:
    """The text an engine adds to an out-of-memory error: this config's needs and a change that fits."""
    current = report.row(stage, offload_optimizer, offload_param, param_nvme=param_nvme)
    lines = [f"model states need about {current.gpu_bytes_per_device / GIB:.2f} GiB per device "
             f"({current.options()}); the device has {gpu_bytes / GIB:.2f} GiB"]
    better = [r for r in fitting_configs(report, gpu_bytes, cpu_bytes) if r != current]
    if better:
        r = better[0]
        lines.append(f"set {r.options()} (about {r.gpu_bytes_per_device / GIB:.2f} GiB per device, "
                     f"{r.cpu_bytes_per_node / GIB:.2f} GiB CPU per node)")
    else:
        lines.append("no stage or offload choice fits: use more devices or a smaller model")
    return "; ".join(lines)


def out_of_memory_note(model, config, world_size: int, local_world_size: int, device=None) -> str:
    """For an engine catching torch.OutOfMemoryError: this run's estimate and a config that fits.

    ``config`` is the resolved ZeroConfig; the device's total memory is read from CUDA when
    available (without it the note names only the estimate).
    """
    import torch

    nodes = max(1, world_size // max(1, local_world_size))
    zero = config.zero_optimization
    overlap = zero.offload_optimizer is not None and zero.offload_optimizer.overlap_step   # host gradient buffers
    report = estimate_memory(model, num_gpus_per_node=max(1, local_world_size), num_nodes=nodes,
                             engine="deepspeed" if overlap else "dslaunch")
    stage = int(config.zero_stage)
    offload_optimizer = bool(zero.offload_optimizer_active) and stage > 0
    offload_param = bool(zero.offload_param is not None and zero.offload_param.active) and stage == 3
    offload_optimizer = offload_optimizer or offload_param   # the estimator has no params-only row
    nvme = offload_param and zero.offload_param.device == "nvme" and report.engine == "dslaunch"
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        total = torch.cuda.get_device_properties(device if device is not None else 0).total_memory
        return out_of_memory_hint(report, stage, offload_optimizer, offload_param, int(total * 0.9), param_nvme=nvme)
    row = report.row(stage, offload_optimizer, offload_param, param_nvme=nvme)
    return f"model states need about {row.gpu_bytes_per_device / GIB:.2f} GiB per device ({row.options()})"


def format_table(report: MemoryReport) -> str:
    """DeepSpeed-style text table, one line per configuration."""
    nodes = "nodes" if report.num_nodes > 1 else "node"
    gpus = "GPUs" if report.num_gpus_per_node > 1 else "GPU"
    largest = f"{report.largest_layer_params / 1e6:.1f}M largest layer params"
    if report.largest_layer_assumed:
        largest += " (assumed; pass --largest_layer)"
    lines = ["Estimated memory for model states (params, gradients, optimizer states):",
             f"HW: {report.num_nodes} {nodes}, {report.num_gpus_per_node} {gpus} per node.",
             f"SW: {report.total_params / 1e6:.1f}M total params, {largest}; "
             f"{'dslaunch' if report.engine == 'dslaunch' else 'DeepSpeed'}'s figures.",
             "  per CPU node |  per GPU   | options (GiB = 2**30 bytes)"]
    for r in report.rows:
        lines.append(f" {r.cpu_bytes_per_node / GIB:9.2f}GiB | {r.gpu_bytes_per_device / GIB:7.2f}GiB | {r.options()}")
    return "\n".join(lines)


def gpt_params(layers: int, hidden: int, vocab: int, positions: int = 0) -> tuple[int, int]:
    """(total, largest layer) of a GPT block stack: per layer 12h^2 + 13h, plus embeddings."""
    total = layers * (12 * hidden * hidden + 13 * hidden) + vocab * hidden + positions * hidden + 2 * hidden
    largest = max(vocab * hidden, 4 * hidden * hidden + 4 * hidden)
    return total, largest


def _build_model(spec: str):
    """`package.module:callable` built on the meta device so that no memory is spent."""
    import importlib

    import torch

    module_name, _, attr = spec.partition(":")
    if not attr:
        raise UsageError(f"--model {spec!r} is not 'module:callable'", hint="e.g. --model mypkg.models:build_gpt")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise UsageError(f"--model {spec!r}: {err}") from err
    with torch.device("meta"):
        return factory()


def parse_args(argv):
    p = argparse.ArgumentParser(prog="dslaunch-estimate", description=__doc__.split("\n")[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--params", type=parse_count, help="total number of parameters: 1.5B, 350M, 1.5e9")
    what.add_argument("--gpt", metavar="LAYERS,HIDDEN,VOCAB", help="a GPT shape, e.g. 48,1600,50257")
    what.add_argument("--model", metavar="MODULE:CALLABLE", help="build this model on the meta device and count it")
    p.add_argument("--largest_layer", "--largest-layer", type=parse_count, default=None,
                   help="parameters of the largest layer (ZeRO-3 gathers it whole)")
    p.add_argument("--num_gpus", "--num-gpus", "--num_gpus_per_node", type=int, default=1)
    p.add_argument("--num_nodes", "--num-nodes", type=int, default=1)
    p.add_argument("--buffer_factor", "--buffer-factor", type=float, default=1.5,
                   help="CPU-side safety factor (DeepSpeed's additional_buffer_factor)")
    p.add_argument("--engine", choices=ENGINES, default="dslaunch",
                   help="whose figures: dslaunch's engine (stage 3 offload: 12 host bytes a parameter) or "
                        "DeepSpeed's estimators (16)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    return p.parse_args(argv)


_SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str) -> float:
    """A parameter count as people write it: 1.5B, 350M, 125k, 1.5e9 (argparse type)."""
    import argparse

    value = text.strip().replace("_", "").replace(",", "")
    scale = _SUFFIXES.get(value[-1:].lower(), 1.0)
    if scale != 1.0:
        value = value[:-1]
    try:
        return float(value) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count: write 1.5B, 350M, 125k or 1.5e9") from None


def main(argv=None) -> int:
    """Entry point of `dslaunch-estimate`."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        largest = None if args.largest_layer is None else int(args.largest_layer)
        if args.gpt:
            try:
                layers, hidden, vocab = (int(x) for x in args.gpt.split(","))
            except ValueError:
                raise UsageError(f"--gpt {args.gpt!r} is not LAYERS,HIDDEN,VOCAB", hint="e.g. --gpt 48,1600,50257")
            total, counted = gpt_params(layers, hidden, vocab)
            subject = total
            largest = counted if largest is None else largest
        elif args.model:
            subject = _build_model(args.model)
        else:
            if not math.isfinite(args.params):
                raise UsageError(f"--params {args.params} is not a number")
            subject = args.params
        report = estimate_memory(subject, args.num_gpus, args.num_nodes, largest, args.buffer_factor, args.engine)
    except DslaunchError as err:
        print(f"dslaunch-estimate: {err.kind}: {err.message}", file=sys.stderr)
        if err.hint:
            print(f"  hint: {err.hint}", file=sys.stderr)
        return err.exit_code
    if args.json:
        import json
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(format_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
