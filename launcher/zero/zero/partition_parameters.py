"""``deepspeed.runtime.zero.partition_parameters``: ``Init``, ``GatheredParameters``, ``ZeroParamStatus``,
and the names transformers reaches for around ``zero.Init`` (the constructor wrapper, ``get_accelerator``)."""
from launcher.zero.distributed.accelerator import get_accelerator  # noqa: F401
from launcher.zero.stages.stage3.init_context import (  # noqa: F401
    GatheredParameters, Init, _orig_torch_arange, register_external_parameter, unregister_external_parameter,
    zero_wrapper_for_fp_tensor_constructor,
)
from launcher.zero.stages.stage3.params import ZeroParamStatus  # noqa: F401
