"""The environments of the acceptance run's processes (scripts/gpu_accept.py).

``process_env``: a world of one on 127.0.0.1 for each process. ``python_without_deepspeed``: a
Python that sees every package this one sees except DeepSpeed, for the Trainer run under
``dslaunch --as-deepspeed``. The shim refuses to hide a real DeepSpeed (launcher/zero/shim), and the
same run needs the real one for DeepSpeed's cells. The Python is a throwaway venv whose one .pth
file adds this interpreter's package folders, with each folder that holds DeepSpeed replaced by a
folder of links to everything else in it.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(device: str) -> dict[str, str]:
    """A world of one on 127.0.0.1 (a fresh port per process), this repository first on the path."""
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    if device == "cpu":
        env.update(DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="")
    elif "TORCH_CUDA_ARCH_LIST" not in env and (archs := arch_list(_capabilities())):
        env["TORCH_CUDA_ARCH_LIST"] = archs
    return env


def arch_list(capabilities: list[tuple[int, int]]) -> str:
    """TORCH_CUDA_ARCH_LIST for these cards, as plain ``major.minor`` numbers: left unset, DeepSpeed
    0.19.8's op builder reads the arch list from torch, gets ``9.0a`` on an H100 and fails to parse it
    (``invalid literal for int() with base 10: '0a'``), so every DeepSpeed cell errors."""
    return ";".join(sorted({f"{major}.{minor}" for major, minor in capabilities}))


def _capabilities() -> list[tuple[int, int]]:
    import torch   # only for a CUDA run; the parent has loaded it already
    return [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]


def _holds_deepspeed(folder: str) -> bool:
    return any(name == "deepspeed" or name.startswith("deepspeed-") for name in os.listdir(folder))


def _view_without_deepspeed(entry: str, view: str) -> str:
    """A folder of links to everything in ``entry`` but DeepSpeed."""
    os.makedirs(view, exist_ok=True)
    for name in os.listdir(entry):
        if not (name == "deepspeed" or name.startswith("deepspeed-")):
            os.symlink(os.path.join(entry, name), os.path.join(view, name))
    return view


def python_without_deepspeed(folder: str) -> tuple[str, dict[str, str]]:
    """(a python executable, the env changes it needs): this interpreter's packages, DeepSpeed left out.
    Where DeepSpeed comes only from PYTHONPATH (the GPU machine: scripts/gpu_runs.sh installs it in
    /tmp/site), this Python with those PYTHONPATH folders swapped for views; else a throwaway venv."""
    held = [p for p in sys.path if p and os.path.isdir(p) and _holds_deepspeed(p)]
    from_env = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if held and all(os.path.realpath(p) in map(os.path.realpath, from_env) for p in held):
        paths = [_view_without_deepspeed(p, os.path.join(folder, f"view{i}"))
                 if os.path.isdir(p) and _holds_deepspeed(p) else p for i, p in enumerate(from_env)]
        return sys.executable, {"PYTHONPATH": os.pathsep.join([REPO, *paths])}
    stdlib = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")}
    entries = [p for p in sys.path if p and os.path.isdir(p) and os.path.realpath(p) != os.path.realpath(REPO)
               and not any(os.path.realpath(p).startswith(s) and "-packages" not in p for s in stdlib)]
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", folder], check=True, timeout=120)
    lines = []
    for i, entry in enumerate(entries):
        if _holds_deepspeed(entry):
            entry = _view_without_deepspeed(entry, os.path.join(folder, f"view{i}"))
        lines.append(f"import site; site.addsitedir({entry!r})")
    python = os.path.join(folder, "bin", "python")
    site_packages = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    with open(os.path.join(site_packages, "accept_packages.pth"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return python, {"PYTHONPATH": REPO}
