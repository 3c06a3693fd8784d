"""Load and validate the engine config (dict, JSON or YAML path) into frozen dataclasses.

Torch-free, so that `dslaunch --dry-run --config` can run the same checks as the ranks.
Rules (DeepSpeed 0.19.8's runtime/config.py and its sections' config classes): the batch
triplet, `"auto"` dropped to the default inside sections and derived for batch keys, unknown
keys rejected with the close match suggested.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import math
import os
from typing import Any, Mapping

from launcher.zero.config.schema import (
    ACCEPTED_UNSUPPORTED, DEEPCOMPILE_DEFAULTS, NamedConfig, ZeroConfig, ZeroOptimizationConfig,
)
from launcher.zero.config.not_built import refuse_not_built
from launcher.zero.errors import ConfigError, NotBuiltConfigError

__all__ = ["load_config", "resolve_batch", "ZeroConfig", "ConfigError"]

_FLOAT_MAX = 1.7976931348623157e308
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def load_config(source: Any, world_size: int | None = None, passed_to: str = "initialize") -> ZeroConfig:
    """Parse and validate a config; with ``world_size`` also resolve and check the batch triplet.

    ``source``: a dict, a path (str or PathLike) to a JSON or YAML file, or a ZeroConfig.
    Every error is a ConfigError whose message names where the config came from (the file, or
    "config dict passed to <passed_to>") and the key.
    """
    if isinstance(source, ZeroConfig):
        config = source
    else:
        raw = _read_source(source)
        with named_by(source, passed_to):
            config = build_config(raw)
    if world_size is not None:
        with named_by(source, passed_to):
            config = resolve_batch(config, world_size)
    return config


@contextlib.contextmanager
def named_by(source: Any, passed_to: str = "initialize"):
    """A ConfigError raised inside starts with where the config came from (``describe_source``): the
    checks that run after loading (optimizer, scheduler) name the file or the call as the loader does."""
    try:
        yield
    except ConfigError as error:
        raise type(error)(f"{describe_source(source, passed_to)}: {error.message}", hint=error.hint) from None


def describe_source(source: Any, passed_to: str = "initialize") -> str:
    """Where a config came from, as an error message starts: the file's path, or which call got the dict."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    if isinstance(source, ZeroConfig):
        return f"config passed to {passed_to}"
    return f"config dict passed to {passed_to}"


def _read_source(source: Any) -> dict:
    if isinstance(source, Mapping):
        return dict(source)
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.isfile(path):
            raise ConfigError(f"config file not found: {path}", hint="pass the path of a JSON or YAML file")
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"cannot read config file {path}: {error}", hint="save it as UTF-8 JSON or YAML") from None
        data = _parse_text(text, path)
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the config must be a mapping of keys, got {type(data).__name__}",
                              hint='start the file with "{" (JSON) or "key: value" lines (YAML)')
        return data
    raise ConfigError(f"config: expected a dict or a file path, got {type(source).__name__}",
                      hint='config="ds_config.json" or config={"train_batch_size": 8}')


def _parse_text(text: str, path: str) -> Any:
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: not valid YAML: {error}", hint="check indentation and quoting") from None
        except (RecursionError, ValueError) as error:   # nested past Python's stack; an int of 5000 digits
            raise ConfigError(f"{path}: not a usable YAML config: {error}", hint=None) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}:{error.lineno}: not valid JSON: {error.msg}",
                          hint="JSON needs double quotes and no trailing commas") from None
    except (RecursionError, ValueError) as error:   # nested past Python's stack; an int of 5000 digits
        raise ConfigError(f"{path}: not a usable JSON config: {error}", hint=None) from None


# ---- the generic, metadata-driven builder -----------------------------------------------------
def build_config(raw: dict) -> ZeroConfig:
    """Check every key of ``raw`` against ZeroConfig and build it (batch keys unresolved)."""
    given, raw = raw, dict(raw)
    zero = raw.get("zero_optimization")
    if isinstance(zero, bool):  # legacy: "zero_optimization": true means stage 1
        raw["zero_optimization"] = {"stage": 1 if zero else 0}
    zero = raw.get("zero_optimization")
    if isinstance(zero, Mapping) and zero.get("cpu_offload") is True and "offload_optimizer" not in zero:
        raw["zero_optimization"] = {**zero, "offload_optimizer": {"device": "cpu"}}
    unsupported = {key: raw.pop(key) for key in list(raw) if key in ACCEPTED_UNSUPPORTED or _names_nested_key(key)}
    values = _build_section(ZeroConfig, raw, "")
    config = ZeroConfig(**values, unsupported=unsupported, raw=_jsonable(given))
    _check_semantics(config)
    return config


def _names_nested_key(key: Any) -> bool:
    """A top-level key spelling a nested one with dots (``"zero_optimization.reduce_bucket_size"``, as TRL's
    ``prepare_deepspeed`` writes them). DeepSpeed reads no key so and ignores it; so does this engine, saying so."""
    if not isinstance(key, str) or "." not in key:
        return False
    section: Any = ZeroConfig
    for part in key.split("."):
        fields = {f.name: f for f in dataclasses.fields(section)} if dataclasses.is_dataclass(section) else {}
        if part not in fields:
            return False
        section = fields[part].metadata.get("section")
    return True


def _build_section(cls: type, raw: Any, prefix: str) -> dict:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {_show(raw)}",
                          hint='write it as {"key": value}')
    fields = {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("kind") != "internal"}
    aliases = {alias: f.name for f in fields.values() for alias in f.metadata.get("aliases", ())}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = aliases.get(key, key)
        if name not in fields:
            known = sorted(set(fields) | set(aliases))
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f"did you mean '{prefix}{close[0]}'?" if close else f"known keys: {', '.join(known)}"
            raise ConfigError(f"unknown config key '{prefix}{key}'", hint=hint)
        if name in values:
            raise ConfigError(f"config key '{prefix}{key}' given twice (also as an alias)",
                              hint=f"keep only '{prefix}{name}'")
        meta = fields[name].metadata
        if value == "auto" and not meta.get("batch"):
            continue  # as DeepSpeed's sub-configs: "auto" falls back to the default
        values[name] = _convert(value, meta, f"{prefix}{name}")
    return values


def _convert(value: Any, meta: Mapping, key: str) -> Any:
    kind = meta["kind"]
    if value is None:
        if meta.get("nullable"):
            return None
        raise ConfigError(f"{key}: null is not allowed", hint=f"remove '{key}' to get the default")
    if meta.get("batch") and value == "auto":
        return "auto"
    if kind == "section":
        section = meta["section"]
        if section is NamedConfig:
            return _named(value, key)
        return section(**_build_section(section, value, key + "."))
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {_show(value)}", hint=f'"{key.split(".")[-1]}": true')
        return value
    if kind in ("int", "float"):
        if "infinite" in meta and isinstance(value, float) and value == math.inf:
            return meta["infinite"]   # what DeepSpeed's arithmetic makes of it (steps_per_print: never)
        value = _number(value, kind, key)
        _check_range(value, meta, key)
    elif kind == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {_show(value)}", hint=None)
    elif kind == "dict":
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {_show(value)}", hint=None)
        value = dict(value)
    choices = meta.get("choices")
    if choices is not None and meta.get("any_case") and isinstance(value, str):   # DeepSpeed upper-cases it
        value = {str(choice).lower(): choice for choice in choices}.get(value.lower(), value)
    if choices is not None and value not in choices:
        raise ConfigError(f"{key}: {_show(value)} is not one of {', '.join(map(str, choices))}",
                          hint=f"set {key} to one of {', '.join(map(str, choices))}")
    return value


def _number(value: Any, kind: str, key: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key}: expected a number, got {_show(value)}", hint=None)
    if isinstance(value, float) and not math.isfinite(value):   # math.isfinite(10**400) raises OverflowError
        raise ConfigError(f"{key}: must be a finite number, got {value}", hint=None)
    if kind == "float" and abs(value) > _FLOAT_MAX:
        raise ConfigError(f"{key}: the number is too large for a float", hint=None)
    if kind == "int":
        if isinstance(value, float) and not value.is_integer():
            raise ConfigError(f"{key}: expected a whole number, got {value}", hint=f"{key}: {int(value)}")
        return int(value)
    return float(value)


def _check_range(value: float, meta: Mapping, key: str) -> None:
    if "min" in meta and value < meta["min"]:
        raise ConfigError(f"{key}: must be >= {meta['min']}, got {value}", hint=None)
    if "min_exclusive" in meta and value <= meta["min_exclusive"]:
        raise ConfigError(f"{key}: must be > {meta['min_exclusive']}, got {value}", hint=None)
    if "max" in meta and value > meta["max"]:
        raise ConfigError(f"{key}: must be <= {meta['max']}, got {value}", hint=None)


def _named(value: Any, key: str) -> NamedConfig:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected {{\"type\": ..., \"params\": {{...}}}}, got {_show(value)}", hint=None)
    extra = set(value) - {"type", "params"}
    if extra:
        bad = str(sorted(extra, key=str)[0])   # YAML keys may be ints, dates, None
        close = difflib.get_close_matches(bad, ["type", "params"], n=1)
        hint = f"did you mean '{key}.{close[0]}'?" if close else f"put constructor arguments under '{key}.params'"
        raise ConfigError(f"unknown config key '{key}.{bad}'", hint=hint)
    kind = value.get("type")
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"{key}.type: missing or not a string", hint=f'"{key}": {{"type": "AdamW", "params": {{"lr": 1e-3}}}}')
    params = value.get("params", {}) or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"{key}.params: expected a mapping, got {_show(params)}", hint=None)
    # "auto" (HF Trainer's convention) falls back to the constructor's default
    return NamedConfig(type=kind, params={k: v for k, v in params.items() if v != "auto"})


def no_effect_notes(config: ZeroConfig) -> list[str]:
    """One line for each setting that loads but changes nothing here, for the engine to print."""
    zero = config.zero_optimization
    nvme = (zero.offload_optimizer_active and zero.offload_optimizer.device == "nvme") or \
        (zero.offload_param is not None and zero.offload_param.device == "nvme")
    notes = [f"config section '{name}' is accepted but has no effect in this engine" for name in config.unsupported
             if "." not in name and not (nvme and name == "aio")]
    if nvme and "aio" in config.unsupported:
        aio = config.unsupported["aio"]
        keys = ", ".join(sorted(aio)) if isinstance(aio, Mapping) and aio else "(none set)"
        notes.append(f"config section 'aio' ({keys}): none of its keys has a meaning here: NVMe offload reads and "
                     "writes its files with plain pread/pwrite on one background thread, no libaio or GDS")
    notes += [f"config key '{name}' is a top-level key with dots, not the nested key it spells: DeepSpeed reads no "
              "key so and neither does this engine, so it has no effect" for name in config.unsupported if "." in name]
    notes += [f"config key '{key}' ({'set' if dataclasses.is_dataclass(value) else repr(value)}) is accepted "
              "but has no effect in this engine" for key, value in _set_without_effect(config, "")]
    offload = zero.offload_param
    if offload is not None and offload.device == "nvme" and offload.max_in_cpu != 1_000_000_000:
        notes.append(f"zero_optimization.offload_param.max_in_cpu ({offload.max_in_cpu}) has no effect: with device "
                     "'nvme' every partitioned parameter's shard lives in the file, and host memory holds only "
                     "buffer_count staging buffers of buffer_size elements")
    return notes


def _set_without_effect(section: Any, prefix: str) -> list[tuple[str, Any]]:
    """(key, value) of every key documented as accepted-only that the config sets off its default."""
    found = []
    for f in dataclasses.fields(section):
        meta = f.metadata
        if meta.get("kind") == "internal":
            continue
        value = getattr(section, f.name)
        if meta.get("kind") == "section" and dataclasses.is_dataclass(value) and not meta["doc"].startswith("accepted"):
            found += _set_without_effect(value, f"{prefix}{f.name}.")
            continue
        if not str(meta.get("doc", "")).startswith("accepted"):
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if value != default:
            found.append((f"{prefix}{f.name}", value))
    return found


def get_zero_config(param_dict: Mapping) -> ZeroOptimizationConfig:
    """DeepSpeed's ``get_zero_config``: the checked ``zero_optimization`` section of a config dict
    (``deepspeed.runtime.zero.config``; ``true`` there is stage 1, its legacy form)."""
    return build_config({"zero_optimization": param_dict.get("zero_optimization", {})}).zero_optimization


# ---- rules that involve more than one key ---------------------------------------------------
def _check_partial_offload(zero) -> None:
    """``offload_optimizer.ratio`` below 1 is built at stages 1-3 with device "cpu" (DeepSpeed
    0.19.8 builds it at stage 3 only and refuses it at stages 1-2; here stages 1-2 cut by the same
    sub-group rule over each rank's partition: stages/partial_offload.py); with NVMe it is refused
    by name (NVMe offload itself needs stage 3)."""
    ratio = zero.offload_optimizer.ratio
    if ratio < 1.0 and zero.offload_optimizer.device == "nvme":
        raise NotBuiltConfigError(f"zero_optimization.offload_optimizer.ratio {ratio} with device 'nvme': "
                                  "partial offload to NVMe is not built", hint='use device "cpu" with ratio, or '
                                  "remove ratio")


def _check_semantics(config: ZeroConfig) -> None:
    if config.fp16.enabled and config.bf16.enabled:
        raise ConfigError("fp16.enabled and bf16.enabled are both true", hint="enable only one of them")
    zero = config.zero_optimization
    stage = zero.stage
    if zero.offload_param is not None and zero.offload_param.active and stage != 3:
        raise ConfigError(f"zero_optimization.offload_param needs stage 3 (stage is {stage})",
                          hint="set zero_optimization.stage to 3 or remove offload_param")
    if zero.offload_optimizer_active:
        if stage == 0:
            raise ConfigError("zero_optimization.offload_optimizer needs stage 1, 2 or 3",
                              hint="set zero_optimization.stage to 1 or more")
        if zero.offload_optimizer.device == "nvme" and stage != 3:
            raise ConfigError("zero_optimization.offload_optimizer.device 'nvme' needs stage 3", hint="use device 'cpu'")
        _check_partial_offload(zero)
        if zero.offload_optimizer.overlap_step and zero.offload_optimizer.device != "cpu":
            raise ConfigError("zero_optimization.offload_optimizer.overlap_step needs device 'cpu'",
                              hint="set offload_optimizer.device to 'cpu' or remove overlap_step")
    if zero.offload_param is not None and zero.offload_param.overlap_step:
        raise ConfigError("zero_optimization.offload_param.overlap_step: the key belongs to offload_optimizer",
                          hint='"offload_optimizer": {"device": "cpu", "overlap_step": true}')
    for section in ("offload_optimizer", "offload_param"):
        off = getattr(zero, section)
        if off is not None and off.device == "nvme" and not off.nvme_path:
            raise ConfigError(f"zero_optimization.{section}.nvme_path is required for device 'nvme'",
                              hint='"nvme_path": "/local_nvme"')
    if stage > 0 and zero.reduce_scatter and (config.gradient_predivide_factor != 1.0 or config.prescale_gradients):
        raise ConfigError("gradient_predivide_factor / prescale_gradients cannot be used with ZeRO reduce_scatter",
                          hint="set gradient_predivide_factor to 1.0 and prescale_gradients to false")
    if config.gradient_allreduce_op == "sum" and stage == 3:
        raise ConfigError("gradient_allreduce_op 'sum' is not allowed with ZeRO stage 3", hint="use 'mean'")
    if config.optimizer is not None:
        if "max_grad_norm" in config.optimizer.params:
            raise ConfigError("optimizer.params.max_grad_norm is not supported",
                              hint="use the top-level gradient_clipping key instead")
        if config.optimizer.type.lower() == "lamb" and config.fp16.enabled and not config.fp16.dynamic:
            raise ConfigError("optimizer Lamb needs dynamic loss scaling (fp16.loss_scale is static)",
                              hint="set fp16.loss_scale to 0")
    _check_compile(config)
    _check_bf16_states(config)
    refuse_not_built(config)   # DeepSpeed keys whose features are not built here (config/not_built.py)
    for key in BATCH_KEYS:
        value = getattr(config, key)
        if value is not None and value != "auto" and (not isinstance(value, int) or value < 1):
            raise ConfigError(f"{key}: must be a whole number >= 1, got {_show(value)}", hint=None)


def _check_bf16_states(config: ZeroConfig) -> None:
    """DeepSpeed 0.19.8's rules for the bf16 masters and moments (runtime/config.py and
    base_optimizer._configure_master_weights); the CPU Adam's side is checked where the optimizer
    exists (optim/factory.py, check_master_dtype_support)."""
    bf16, zero = config.bf16, config.zero_optimization
    if bf16.bf16_optimizer_states and not bf16.bf16_master_weights_and_grads:
        raise ConfigError("bf16.bf16_optimizer_states needs bf16.bf16_master_weights_and_grads",
                          hint='"bf16": {"enabled": true, "bf16_master_weights_and_grads": true, '
                               '"bf16_optimizer_states": true}')
    if not bf16.bf16_master_weights_and_grads:
        return
    if not bf16.enabled:
        raise ConfigError("bf16.bf16_master_weights_and_grads needs bf16.enabled", hint='set "bf16": {"enabled": true}')
    if zero.stage == 0:
        raise ConfigError("bf16.bf16_master_weights_and_grads needs ZeRO stage 1, 2 or 3 (stage is 0)",
                          hint="set zero_optimization.stage to 1, 2 or 3")
    if not zero.offload_optimizer_active and not bf16.bf16_optimizer_states:
        raise ConfigError("bf16.bf16_master_weights_and_grads needs zero_optimization.offload_optimizer (the CPU "
                          "Adam keeps fp32 moments of bf16 masters), unless bf16.bf16_optimizer_states keeps bf16 "
                          "moments on the device", hint='add "offload_optimizer": {"device": "cpu"} or set '
                                                        'bf16.bf16_optimizer_states to true')
    moments = config.optimizer.params.get("fp32_optimizer_states") if config.optimizer is not None else None
    if bf16.bf16_optimizer_states and moments:
        raise ConfigError("optimizer.params.fp32_optimizer_states true contradicts bf16.bf16_optimizer_states",
                          hint="remove fp32_optimizer_states (bf16_optimizer_states keeps the moments in bf16)")


def _check_compile(config: ZeroConfig) -> None:
    """DeepSpeed 0.19.8's DeepCompile keys load at their defaults; any other value names the key."""
    for key, default in DEEPCOMPILE_DEFAULTS.items():
        value = getattr(config.compile, key)
        if value != default:
            raise NotBuiltConfigError(f"compile.{key} {_show(value)}: DeepSpeed's DeepCompile is not built in dslaunch's "
                                      "engine", hint=f'remove compile.{key}; "compile": {{"enabled": true}} or '
                                      "engine.compile() compiles with torch.compile")
    if "backend" in config.compile.kwargs:
        raise ConfigError("compile.kwargs.backend: the backend has its own key",
                          hint='"compile": {"enabled": true, "backend": "inductor", "kwargs": {...}}')


def resolve_batch(config: ZeroConfig, world_size: int) -> ZeroConfig:
    """Fill the batch triplet for a data-parallel world size (DeepSpeed's rule; remainders fail)."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size must be >= 1, got {world_size!r}", hint=None)
    tbs, mbs, gas = (None if getattr(config, k) == "auto" else getattr(config, k) for k in BATCH_KEYS)
    autos = [k for k in BATCH_KEYS if getattr(config, k) == "auto"]
    if tbs is not None and mbs is not None and gas is not None:
        pass
    elif tbs is not None and mbs is not None:
        gas = tbs // mbs // world_size
    elif tbs is not None and gas is not None:
        mbs = tbs // world_size // gas
    elif mbs is not None and gas is not None:
        tbs = mbs * gas * world_size
    elif tbs is not None:
        gas, mbs = 1, tbs // world_size
    elif mbs is not None:
        gas, tbs = 1, mbs * world_size
    else:
        what = ("'auto' cannot be resolved for " + ", ".join(autos)) if autos else \
            "neither train_batch_size nor train_micro_batch_size_per_gpu is set"
        raise ConfigError(f"batch size: {what}",
                          hint="set train_micro_batch_size_per_gpu (and gradient_accumulation_steps), "
                               "or train_batch_size")
    if mbs < 1 or gas < 1 or tbs != mbs * gas * world_size:
        raise ConfigError(
            f"train_batch_size ({tbs}) is not equal to train_micro_batch_size_per_gpu ({mbs}) x "
            f"gradient_accumulation_steps ({gas}) x world_size ({world_size})",
            hint=f"train_batch_size must be a multiple of {world_size} x micro batch x accumulation steps; "
                 f"for example train_batch_size {max(mbs, 1) * max(gas, 1) * world_size}")
    return dataclasses.replace(config, train_batch_size=tbs, train_micro_batch_size_per_gpu=mbs,
                               gradient_accumulation_steps=gas)


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, (str, bool)) or value is None else f"{value!r} ({type(value).__name__})"


def _jsonable(raw: dict) -> dict:
    try:
        return json.loads(json.dumps(raw))
    except (TypeError, ValueError):
        return {key: repr(value) for key, value in raw.items()}
