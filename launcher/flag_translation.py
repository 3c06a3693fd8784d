"""torchrun's and DeepSpeed's flags that dslaunch takes in its own terms, or answers with what replaces them.

`--nnodes`, `--nproc_per_node`, `--enable_each_rank_log`, `--force_multi` and `--bind_cores_to_rank` are plain spellings
(cli.py); the ones here change other options or have no counterpart, and say so instead of being
ignored.
"""
from __future__ import annotations

from launcher.errors import UsageError


def translate_foreign_flags(flags: dict) -> dict:
    """The flags with torchrun's `--standalone` / `--node_rank` / `--tee` / `--redirects` dealt with."""
    flags = dict(flags)
    for name in ("tee", "redirects"):
        if flags.pop(name, None) is not None:
            raise UsageError(f"--{name}: dslaunch always streams every rank's stdout and stderr, prefixed "
                             "'[rank N]', to this console", hint="for per-rank files use --log_dir DIR")
    if flags.pop("standalone", False):
        if flags.get("hostfile") or flags.get("master_addr"):
            raise UsageError("--standalone runs on this machine only: it cannot go with --hostfile or --master_addr",
                             hint="drop --standalone for a multi-node job")
        flags["hostfile"] = None
        flags["this_machine_only"] = True   # not even the default /job/hostfile
        flags["launcher"] = flags.get("launcher") or "local"
        flags["master_port"] = 0   # torchrun's standalone rendezvous: a free port
    node_rank = flags.pop("node_rank", None)
    if node_rank not in (None, 0):
        raise UsageError(f"--node_rank {node_rank}: dslaunch starts every node itself, from one machine",
                         hint="run dslaunch once, with a hostfile naming every node; do not start it per node")
    return flags
