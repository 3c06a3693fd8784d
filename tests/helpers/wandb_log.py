"""Read back what wandb wrote offline: the records of a ``run-*.wandb`` file (a LevelDB-style log of
protobuf ``Record`` messages), so that tests check logged values without a W&B server."""
from __future__ import annotations

import glob
import json
import os
import struct

BLOCK = 32768
HEADER = 7          # ":W&B" + magic (2 bytes) + version; each record: crc32c (4), length (2), type (1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str) -> list:
    """Every Record in the file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    with open(path, "rb") as handle:
        data = handle.read()
    assert data[:4] == b":W&B", f"{path}: not a wandb log"
    found, pending, offset = [], b"", HEADER
    while offset + 7 <= len(data):
        left = BLOCK - offset % BLOCK
        if left < 7:   # the rest of a block too small for a record header is padding
            offset += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[offset:offset + 7])
        chunk = data[offset + 7:offset + 7 + length]
        offset += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            found.append(record)
    return found


def history(run_dir: str) -> list[dict]:
    """The ``wandb.log`` rows of the one offline run under ``run_dir`` (its ``wandb`` folder's parent)."""
    [path] = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def run_facts(run_dir: str) -> dict:
    """The run record's project, group and name."""
    [path] = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    for record in records(path):
        if record.WhichOneof("record_type") == "run":
            return {"project": record.run.project, "group": record.run.run_group, "name": record.run.display_name}
    return {}
