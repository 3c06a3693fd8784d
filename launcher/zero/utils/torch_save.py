"""``deepspeed.checkpoint.utils``: ``clone_tensors_for_torch_save`` (accelerate's ``get_state_dict``)."""
from launcher.zero.checkpoint.tensors import clone_tensors_for_torch_save  # noqa: F401
