"""``launcher.zero.progress.beat(step)``: the path plain scripts were told to call before the stall
beat's module was named for what it is (``launcher/zero/stall_beat.py``, issue 40). A public path
stays where users wrote it; this one only re-exports."""
from launcher.zero.stall_beat import beat

__all__ = ["beat"]
