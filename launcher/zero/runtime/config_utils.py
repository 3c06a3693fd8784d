"""``deepspeed.runtime.config_utils``: DeepSpeed's config helpers; ``DeepSpeedConfigModel`` and
``get_config_default`` need pydantic and are imported on first use.

Built in ``launcher/zero/config/deepspeed_helpers.py`` and ``launcher/zero/config/pydantic_model.py``.
"""
import importlib as _importlib

from launcher.zero.errors import NotSupportedError as _NotSupportedError
from launcher.zero.config.deepspeed_helpers import (  # noqa: F401
    DeepSpeedConfigObject, ScientificNotationEncoder, dict_raise_error_on_duplicate_keys, get_dict_param,
    get_list_param, get_scalar_param, pp_int,
)

_PYDANTIC = ("DeepSpeedConfigModel", "get_config_default")


def __getattr__(name: str):
    """The pydantic names, from config/pydantic_model.py when a script reaches for them."""
    if name not in _PYDANTIC:
        raise AttributeError(f"module '{__name__}' has no attribute '{name}'")
    try:
        module = _importlib.import_module("launcher.zero.config.pydantic_model")
    except ModuleNotFoundError as missing:
        raise _NotSupportedError(f"deepspeed.runtime.config_utils.{name} needs pydantic ({missing})",
                                 hint="pip install pydantic (DeepSpeed depends on it; dslaunch does not)") from None
    return getattr(module, name)
