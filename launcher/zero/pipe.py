"""``deepspeed.pipe``: pipeline parallelism is not in this engine yet; using a name says so.

Importing the module works (so ``import deepspeed.pipe`` at the top of a script that does not
use it is fine); ``PipelineModule``, ``LayerSpec``, ... raise NotSupportedError.
"""
from launcher.zero.errors import NotSupportedError

_NAMES = ("PipelineModule", "LayerSpec", "TiedLayerSpec", "ProcessTopology", "PipeModelDataParallelTopology")


def __getattr__(name: str):
    if name in _NAMES:
        raise NotSupportedError(f"deepspeed.pipe.{name}: pipeline parallelism is not supported by dslaunch's "
                                "engine yet", hint="train with ZeRO data parallelism (stage 3 for large models)")
    raise AttributeError(f"module 'launcher.zero.pipe' (deepspeed.pipe) has no attribute '{name}'")
