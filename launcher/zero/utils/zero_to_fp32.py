"""``deepspeed.utils.zero_to_fp32``: a ZeRO checkpoint's shards joined into one fp32 state dict, and
DeepSpeed's file helpers (Lightning's conversion calls them)."""
from launcher.zero.checkpoint.consolidate import (  # noqa: F401
    convert_zero_checkpoint_to_fp32_state_dict, get_fp32_state_dict_from_zero_checkpoint,
    load_state_dict_from_zero_checkpoint,
)
from launcher.zero.checkpoint.deepspeed_files import (  # noqa: F401
    get_checkpoint_files, get_model_state_file, get_model_state_files, get_optim_files,
)
