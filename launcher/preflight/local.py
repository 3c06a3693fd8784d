"""Checks of this machine: the program the chosen runner needs, with the install hint.

`which` and `run` are passed in (shutil.which, subprocess.run) so tests can stand in.
"""
from __future__ import annotations

import subprocess
from typing import Callable

from launcher.preflight.report import Check

INSTALL = {
    "pdsh": "apt-get install pdsh (Debian/Ubuntu) or dnf install pdsh pdsh-rcmd-ssh (RHEL), "
            "or use --launcher ssh",
    "mpirun": "apt-get install openmpi-bin (Debian/Ubuntu) or dnf install openmpi, "
              "or use --launcher ssh",
    "srun": "run dslaunch inside a Slurm allocation (salloc/sbatch) on a node with srun",
    "ssh": "apt-get install openssh-client",
}
PROGRAM = {"pdsh": "pdsh", "openmpi": "mpirun", "slurm": "srun", "ssh": "ssh"}
CHECK_NAME = {"pdsh": "pdsh", "openmpi": "mpirun", "slurm": "srun", "ssh": "ssh_client"}


def launcher_tool_check(launcher: str, which: Callable[[str], str | None] = None,
                        run: Callable = subprocess.run) -> Check | None:
    """The local program `launcher` needs, or None for runners that need none (local)."""
    if which is None:
        import shutil

        which = shutil.which
    program = PROGRAM.get(launcher)
    if program is None:
        return None
    name = CHECK_NAME[launcher]
    path = which(program)
    if not path:
        return Check(name, False, f"{program} not found on this machine (PATH)", INSTALL[program])
    if launcher == "pdsh":
        return _pdsh_modules(path, which, run)
    return Check(name, True, path)


def _pdsh_modules(path: str, which, run) -> Check:
    """pdsh must have its ssh rcmd module (RHEL ships it separately) and ssh must exist."""
    try:
        out = run([path, "-L"], capture_output=True, text=True, timeout=5,
                  stdin=subprocess.DEVNULL)
        listing = (out.stdout or "") + (out.stderr or "")
    except (OSError, subprocess.SubprocessError) as e:
        return Check("pdsh", False, f"{path} -L failed: {e}", INSTALL["pdsh"])
    if "rcmd/ssh" not in listing:
        return Check("pdsh", False, f"{path} has no ssh rcmd module (pdsh -L lists no rcmd/ssh)",
                     "install pdsh's ssh module: dnf install pdsh-rcmd-ssh (Debian's pdsh has it)")
    if not which("ssh"):
        return Check("pdsh", False, "pdsh -R ssh needs the ssh client, which is not on PATH",
                     INSTALL["ssh"])
    return Check("pdsh", True, f"{path} with rcmd/ssh")


def client_check(launcher: str, host, port: int | None, timeout: float,
                 run: Callable = subprocess.run, environ: dict | None = None) -> Check | None:
    """Reach `host` the way the runner will (system ssh, or pdsh -R ssh), in batch mode.

    paramiko may succeed where OpenSSH fails (agent, config it does not read) and vice
    versa, so the full check also runs the runner's own client once per host.
    """
    import os

    name = getattr(host, "name", str(host))
    user = getattr(host, "user", None)
    dest = f"{user}@{name}" if user else name
    batch = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(timeout))}"]
    port_args = ["-p", str(port)] if port else []
    env = dict(os.environ if environ is None else environ)
    if launcher == "pdsh":
        env["PDSH_RCMD_TYPE"] = "ssh"
        env["PDSH_SSH_ARGS_APPEND"] = " ".join(
            filter(None, [env.get("PDSH_SSH_ARGS_APPEND", "")] + batch + port_args))
        # pdsh's own -t (default 10 s) comes first on ssh's command line and so wins
        argv = ["pdsh", "-R", "ssh", "-S", "-t", str(max(1, int(timeout))), "-w", dest, "true"]
        label = "pdsh"
    elif launcher == "ssh":
        argv, label = ["ssh", *batch, *port_args, dest, "true"], "ssh_client"
    else:
        return None
    try:
        out = run(argv, capture_output=True, text=True, timeout=timeout * 2 + 5,
                  stdin=subprocess.DEVNULL, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        return Check(label, False, f"{argv[0]} to {name} failed: {e}", None)
    if out.returncode == 0:
        return Check(label, True, f"{' '.join(argv[:-1])} reached {name}")
    said = [line.strip() for line in (out.stderr or "").splitlines() if line.strip()
            and "exited with exit code" not in line]
    return Check(label, False, f"{argv[0]} could not reach {name} (exit {out.returncode}): "
                 + ("; ".join(said[-2:]) or "no message"),
                 f"the runner uses OpenSSH: make `ssh -o BatchMode=yes {' '.join(port_args + [dest])} "
                 f"true` work (keys, ~/.ssh/config, known_hosts)")
