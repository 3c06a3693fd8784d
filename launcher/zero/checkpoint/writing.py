"""Writing one checkpoint file: torch.save or JSON with its digest, and a failed write (a full
disk, a read-only folder) turned into one sentence with the bytes needed and free."""
from __future__ import annotations

import json
import os
import shutil

import torch

from launcher.zero.checkpoint import digest


def attempt(save_dir: str, partial: str, needed: int, write) -> str | None:
    """Run ``write``; an OSError (a full disk, a read-only folder) as one sentence, else None."""
    try:
        write()
        return None
    except (OSError, RuntimeError) as error:   # torch.save reports a failed write as a RuntimeError
        try:
            free = shutil.disk_usage(save_dir).free
        except OSError:
            free = -1
        if isinstance(error, OSError) and error.errno:
            reason = os.strerror(error.errno)
        elif 0 <= free < max(needed, 1) or "unexpected pos" in str(error) or "iostream" in str(error):
            reason = "the file system is full"   # torch's words for it: "unexpected pos", "iostream error"
        else:
            reason = str(error).splitlines()[0]
        return (f"cannot write checkpoint into {partial}: {reason}; this rank's part needs about {needed} bytes, "
                f"{free if free >= 0 else 'an unknown number of'} bytes are free")


def write_file(folder: str, name: str, value, written: dict) -> None:
    """One checkpoint file (JSON for metadata, else torch.save), and its digest into ``written``."""
    path = os.path.join(folder, name)
    if name.endswith(".json"):
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(value, handle, indent=1)
    else:
        torch.save(value, path)
    written[name] = digest.file_digest(path)


def bytes_of(value) -> int:
    """Bytes of the tensors in a nested structure: about what torch.save writes."""
    if torch.is_tensor(value):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(bytes_of(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(bytes_of(v) for v in value)
    return 0
