"""``deepspeed.moe.experts``: the experts one rank holds."""
from launcher.zero.experts.experts import Experts  # noqa: F401
