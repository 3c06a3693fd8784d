"""``deepspeed.moe``: Mixture of Experts is not in this engine yet; importing it says so."""
from launcher.zero.errors import NotSupportedError

raise NotSupportedError(
    "deepspeed.moe (Mixture of Experts) is not supported by dslaunch's engine yet",
    hint="run this script with DeepSpeed itself, or build the experts as plain modules (no expert parallelism)")
