"""Read the launching machine once (the edge): GPUs, env files, name resolution."""
from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import sys

from launcher.planning import envpolicy
from launcher.planning.plan import Machine


def visible_gpu_ids(environ: dict[str, str]) -> tuple[int, ...]:
    """GPU ids this machine offers, without importing torch."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        items = [v.strip() for v in visible.split(",") if v.strip()]
        if all(v.isdigit() for v in items):
            return tuple(int(v) for v in items)
        return tuple(range(len(items)))
    try:
        return tuple(range(len(os.listdir("/proc/driver/nvidia/gpus"))))
    except OSError:
        return ()


def local_names() -> frozenset[str]:
    names = {"localhost", "127.0.0.1", "::1"}
    try:
        names.add(socket.gethostname())
    except OSError:
        pass
    return frozenset(names)


def resolve_host(host: str) -> str:
    """The address other nodes can use for `host`: ssh config's HostName, then DNS."""
    name = host
    if shutil.which("ssh"):
        try:
            out = subprocess.run(["ssh", "-G", host], capture_output=True, text=True, timeout=5).stdout
            for line in out.splitlines():
                key, _, value = line.partition(" ")
                if key == "hostname" and value:
                    name = value.strip()
                    break
        except (OSError, subprocess.SubprocessError, ValueError):   # ValueError: a NUL in the name
            pass
    try:
        ipaddress.ip_address(name)
        return name
    except ValueError:
        pass
    try:
        for info in socket.getaddrinfo(name, None, family=socket.AF_INET):
            return info[4][0]
    except (socket.gaierror, UnicodeError, ValueError):   # UnicodeError: 'x..y' or a label over 63 characters
        pass
    return name


def read_machine() -> Machine:
    environ = dict(os.environ)
    paths = envpolicy.env_file_paths(os.path.expanduser("~"), os.getcwd(),
                                     environ.get("DS_ENV_FILE", ".deepspeed_env"))
    values, used = envpolicy.read_env_files(paths)
    return Machine(python=sys.executable, cwd=os.getcwd(), environ=environ, gpu_ids=visible_gpu_ids(environ),
                   local_names=local_names(), pdsh_available=shutil.which("pdsh") is not None,
                   env_files=values, env_files_used=tuple(used), resolve=resolve_host)
