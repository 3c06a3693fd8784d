"""What the CLI asks the preflight to check: a frozen record built from the flags."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Mapping

from launcher.planning.plan import LAUNCHERS  # noqa: F401  (defined once, in the plan)


@dataclass(frozen=True)
class PreflightRequest:
    """Everything run_preflight needs besides the hosts.

    ssh_port: `--ssh_port`; a hostfile `host:port` wins over it, it wins over ~/.ssh/config.
    remote_python: interpreter the ranks will use on every node (default: the launcher's).
    workdir: working directory of the ranks (default: the launcher's cwd).
    script: the training script (relative to workdir or absolute); None: not checked.
    master_addr: None means the first host's address as resolved by ssh config.
    master_port: the rendezvous port checked on the first node (0: any free port, as the launch).
    rendezvous: run the master-port and TCP-reachability checks at all.
    launcher: the runner that will start the job ("ssh", "pdsh", "openmpi", "slurm").
    timeout: seconds for ssh connect + authentication, per host (hosts run in parallel).
    probe_timeout: seconds for the remote probe (it may import torch on GPU nodes).
    fast: the pre-launch path: ssh, versions, workdir, rendezvous; no GPU or script checks.
    require_gpus: a host without CUDA fails the gpus check (default: it passes with a warning).
    env: variables the ranks will get (only PYTHONPATH and PATH matter to the probe).
    """

    ssh_port: int | None = None
    remote_python: str = field(default_factory=lambda: sys.executable or "python3")
    workdir: str = field(default_factory=os.getcwd)
    script: str | None = None
    master_addr: str | None = None
    master_port: int = 29500
    rendezvous: bool = True
    launcher: str = "ssh"
    timeout: float = 5.0
    probe_timeout: float = 30.0
    fast: bool = False
    require_gpus: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
