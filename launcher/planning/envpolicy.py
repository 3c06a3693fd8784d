"""What environment reaches the ranks: a written policy, pure functions.

Order of precedence (later wins): forwarded variables of the launcher's shell, env
files (`~/.deepspeed_env`, `~/.dslaunch_env`, `./.deepspeed_env`, `./.dslaunch_env`),
`--env KEY=VALUE`, and last the variables the launcher sets itself (RANK, ...).
On this machine ranks also inherit the launcher's whole environment; on other
nodes they get the agent's login environment plus the forwarded set.
"""
from __future__ import annotations

import os
import re

from launcher.errors import EnvFileError
from launcher.planning.hostfile import LINE_BREAK, show

FORWARD_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "CUDA_", "PYTHON", "OMP_", "MKL_", "HF_",
                    "WANDB_", "UCX_", "FI_", "CONDA_", "MLFLOW_")
FORWARD_NAMES = ("PATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX")
NEVER_FORWARD = ("CUDA_VISIBLE_DEVICES",)
ENV_FILE_NAMES = (".deepspeed_env", ".dslaunch_env")

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_forwarded(name: str) -> bool:
    """True for the variables the default policy sends to other nodes."""
    if name in NEVER_FORWARD:
        return False
    return name in FORWARD_NAMES or name.startswith(FORWARD_PREFIXES)


def forwarded(environ: dict[str, str]) -> dict[str, str]:
    """The part of the launcher's environment that the policy forwards."""
    return {k: v for k, v in sorted(environ.items()) if is_forwarded(k)}


def parse_assignment(text: str, where: str) -> tuple[str, str]:
    """`KEY=VALUE` (an `export ` prefix allowed) -> (KEY, VALUE); VALUE kept verbatim."""
    body = text[len("export "):] if text.startswith("export ") else text
    key, sep, value = body.partition("=")
    key = key.strip()
    if not sep or not _KEY_RE.match(key):
        raise EnvFileError(f"{where}: expected KEY=VALUE, got '{show(text)}'",
                           hint="one assignment per line, e.g. NCCL_DEBUG=INFO")
    if "\x00" in value:   # no process environment can hold it: Popen(env=...) would fail at launch
        raise EnvFileError(f"{where}: the value of {key} holds a NUL character", hint="remove it")
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return key, value


def parse_env_file(text: str, path: str) -> dict[str, str]:
    """Env-file text -> mapping; `#` comments and blank lines are skipped."""
    result = {}
    for number, raw in enumerate(LINE_BREAK.split(text), start=1):   # an editor's lines
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, value = parse_assignment(line, f"{path}:{number}")
        result[key] = value
    return result


def env_file_paths(home: str, cwd: str, deepspeed_name: str = ".deepspeed_env") -> list[str]:
    """The env files looked for, in the order they apply."""
    names = (deepspeed_name, ".dslaunch_env")
    paths = []
    for folder in (home, cwd):
        for name in names:
            path = name if os.path.isabs(name) else os.path.join(folder, name)
            if path not in paths:
                paths.append(path)
    return paths


def read_env_files(paths: list[str]) -> tuple[dict[str, str], list[str]]:
    """Read the env files that exist; returns (values, files read)."""
    values: dict[str, str] = {}
    used = []
    for path in paths:
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise EnvFileError(f"cannot read env file '{path}': {exc}") from None
        values.update(parse_env_file(text, path))
        used.append(path)
    return values, used


def parse_env_options(items: tuple[str, ...]) -> dict[str, str]:
    """`--env KEY=VALUE` options -> mapping."""
    return dict(parse_assignment(item, "--env") for item in items)
