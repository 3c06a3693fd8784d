"""``deepspeed.git_version_info``: ``version`` (the DeepSpeed release this engine matches), ``git_hash``,
``git_branch``, ``installed_ops``, ``accelerator_name``, ``torch_info``.

Built in ``launcher/zero/shim/version_info.py``.
"""
from launcher.zero.shim.version_info import (  # noqa: F401
    accelerator_name, git_branch, git_hash, installed_ops, torch_info, version,
)
