"""Resolve every name of tests/data/deepspeed_imports.txt as a script would, under the ``deepspeed`` shim.

Run by ``dslaunch --as-deepspeed`` (one rank). Prints one ``RESULT`` line per name:
``{"name", "outcome": "ok" | "not_supported" | "broken", "error"}`` -- not_supported is our
NotSupportedError (a feature named as not built), broken anything else. Then the facts integrations
check before they use DeepSpeed at all: the package metadata, ``deepspeed.__version__``, transformers'
and accelerate's ``is_deepspeed_available()``; and what building a Mixture of Experts layer raises.
"""
import importlib
import importlib.metadata
import json
import sys
from pathlib import Path

NAMES = Path(__file__).resolve().parents[3] / "tests" / "data" / "deepspeed_imports.txt"


def resolve(entry: str):
    """``module`` is imported; ``module:first.rest`` is ``from module import first``, then ``.rest``."""
    module_name, _, attributes = entry.partition(":")
    module = importlib.import_module(module_name)
    if not attributes:
        return module
    first, *rest = attributes.split(".")
    try:
        value = getattr(module, first)
    except AttributeError:
        try:   # `from module import first` also finds a submodule not imported yet
            value = importlib.import_module(f"{module_name}.{first}")
        except ModuleNotFoundError as missing:
            if missing.name != f"{module_name}.{first}":
                raise
            raise ImportError(f"cannot import name {first!r} from {module_name!r}") from None
    for name in rest:
        value = getattr(value, name)
    return value


def outcome(error: BaseException | None) -> dict:
    if error is None:
        return {"outcome": "ok", "error": None}
    ours = type(error).__name__ == "NotSupportedError" and type(error).__module__.startswith("launcher")
    return {"outcome": "not_supported" if ours else "broken", "error": f"{type(error).__name__}: {error}"[:300]}


def attempt(action) -> dict:
    try:
        value = action()
    except Exception as error:  # every kind is reported: that is the point of the sweep
        return {**outcome(error), "value": None}
    return {**outcome(None), "value": value}


def emit(record: dict) -> None:
    print("RESULT " + json.dumps(record, default=repr), flush=True)


def main() -> None:
    for line in NAMES.read_text().splitlines():
        entry = line.split("#")[0].strip()
        if entry:
            result = attempt(lambda: resolve(entry))
            emit({"name": entry, "outcome": result["outcome"], "error": result["error"]})

    def moe_layer():
        import torch
        from deepspeed.moe.layer import MoE
        return MoE(hidden_size=4, expert=torch.nn.Linear(4, 4), num_experts=2)

    def transformers_sees_deepspeed():
        from transformers.integrations import is_deepspeed_available
        return is_deepspeed_available()

    def accelerate_sees_deepspeed():
        from accelerate.utils import is_deepspeed_available
        return is_deepspeed_available()

    facts = {"metadata_version": lambda: importlib.metadata.version("deepspeed"),
             "module_version": lambda: importlib.import_module("deepspeed").__version__,
             "transformers_is_deepspeed_available": transformers_sees_deepspeed,
             "accelerate_is_deepspeed_available": accelerate_sees_deepspeed,
             "moe_layer_built": moe_layer}
    for name, action in facts.items():
        result = attempt(action)
        emit({"fact": name, **result, "value": result["value"] if name != "moe_layer_built" else None})


if __name__ == "__main__":
    main()
    sys.exit(0)
