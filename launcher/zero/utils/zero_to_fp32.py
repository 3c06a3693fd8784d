"""``deepspeed.utils.zero_to_fp32``: a ZeRO checkpoint's shards joined into one fp32 state dict."""
from launcher.zero.checkpoint.consolidate import (  # noqa: F401
    convert_zero_checkpoint_to_fp32_state_dict, get_fp32_state_dict_from_zero_checkpoint,
    load_state_dict_from_zero_checkpoint,
)
