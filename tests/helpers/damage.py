"""Damaging one checkpoint file the ways the damaged-checkpoint tests need, and reading their
per-mode stderr back (tests/dist/test_checkpoint_damage.py, test_pipeline_checkpoint_damage.py)."""
import os
import re


def damage(path: str, mode: str) -> None:
    """``truncated``: cut to half; ``bitflip``: one bit of the middle byte (tensor bytes, which
    torch.load reads without complaint); ``missing``: removed; ``shortened``: 100 bytes off the end."""
    if mode == "truncated":
        os.truncate(path, os.path.getsize(path) // 2)
    elif mode == "bitflip":
        with open(path, "r+b") as handle:
            handle.seek(os.path.getsize(path) // 2)
            byte = handle.read(1)
            handle.seek(-1, os.SEEK_CUR)
            handle.write(bytes([byte[0] ^ 0x10]))
    elif mode == "missing":
        os.remove(path)
    elif mode == "shortened":
        os.truncate(path, os.path.getsize(path) - 100)
    else:
        raise ValueError(f"unknown damage {mode!r}")


def by_mode(stderr: str) -> dict:
    """A rank's stderr split at its ``MODE <name>`` lines: name -> what followed."""
    parts = re.split(r"^MODE (\w+)$", stderr, flags=re.M)
    return {mode: text for mode, text in zip(parts[1::2], parts[2::2])}


def warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if "warning:" in line]
