"""Pure: turn each host's probe result into Checks, and compare versions across hosts."""
from __future__ import annotations

from collections import OrderedDict

from launcher.preflight.report import Check

MIN_PYTHON = (3, 10)
REMOTE_PYTHON_HINT = ("--remote_python PATH naming an interpreter that exists on every node "
                      "(with torch and dslaunch installed)")


def minor(version: str | None) -> str | None:
    """'3.11.7' -> '3.11': Python builds of one minor version are interchangeable for us."""
    return ".".join(version.split(".")[:2]) if version else version


def compare_versions(values: dict[str, str | None], reference: str | None = None,
                     what: str = "version") -> dict[str, str | None]:
    """{host: problem or None}. Hosts off the reference (default: the most common value,
    ties to the earliest host) get a problem naming who has what."""
    present = {h: v for h, v in values.items() if v is not None}
    groups: OrderedDict[str, list[str]] = OrderedDict()
    for host, value in present.items():
        groups.setdefault(value, []).append(host)
    if reference is None:
        if len(groups) <= 1:
            return {h: None for h in values}
        reference = max(groups, key=lambda v: len(groups[v]))  # max keeps the first on ties
    problems: dict[str, str | None] = {h: None for h in values}
    if set(groups) <= {reference}:
        return problems
    who = "; ".join(f"{v} on {', '.join(hs)}" for v, hs in groups.items())
    for value, hosts in groups.items():
        if value != reference:
            for host in hosts:
                problems[host] = f"{what} {value} here differs from {reference} ({who})"
    return problems


def _too_old(version: str | None) -> str | None:
    """dslaunch (the agent on every node) needs Python 3.10 or newer."""
    try:
        if tuple(int(x) for x in (version or "").split(".")[:2]) < MIN_PYTHON:
            return f"dslaunch needs Python {'.'.join(map(str, MIN_PYTHON))} or newer"
    except ValueError:
        return None
    return None


def first_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def probe_failed(python: str, rc: int | None, stderr: str, host: str) -> Check:
    """The probe did not report: the interpreter is missing or crashed (a 'python' failure)."""
    if rc in (126, 127):
        return Check("python", False, f"remote python '{python}' not found or not executable on "
                     f"{host} (exit {rc}: {first_line(stderr)})", REMOTE_PYTHON_HINT)
    if rc is None:
        return Check("python", False, f"remote command on {host} gave no answer "
                     f"({first_line(stderr) or 'timed out'})", f"try: ssh {host} {python} -V")
    return Check("python", False, f"remote command failed on {host} (exit {rc}: "
                 f"{first_line(stderr) or 'no output'})",
                 f"try: ssh {host} {python} -V; it must be Python 3.6 or newer")


def gpu_check(result: dict, slots: int, require_gpus: bool) -> Check:
    """GPUs versus slots. No CUDA at all passes with a warning unless GPUs were required:
    CPU-only nodes (gloo) are a legitimate setup, a torch without CUDA on a GPU node is not."""
    torch = result.get("torch") or {}
    smi = result.get("nvidia_smi_gpus")
    count = torch.get("device_count") if torch.get("cuda_available") else None
    if count is None and smi and torch.get("cuda_available") is None:
        count = smi  # torch was not imported (or not importable): trust nvidia-smi
    if smi and torch.get("cuda_available") is False:
        return Check("gpus", False, f"nvidia-smi lists {smi} GPU(s) but torch "
                     f"{torch.get('version')} sees no CUDA",
                     "install a CUDA build of torch matching the driver (pip install torch --index-url ...)")
    if not count:
        detail = f"no CUDA GPU; {slots} slot(s) will run on CPU (gloo)"
        if require_gpus:
            return Check("gpus", False, detail, "run on GPU nodes, or drop the GPU requirement")
        return Check("gpus", True, detail, None, warning=True)
    if count < slots:
        return Check("gpus", False, f"{count} GPU(s) but slots={slots} in the hostfile",
                     f"set slots={count} for this host, or use --num_gpus {count}")
    return Check("gpus", True, f"{count} GPU(s) for {slots} slot(s)")


def host_checks(host: str, slots: int, result: dict, request, problems: dict) -> list[Check]:
    """Checks from one host's probe result; `problems` holds cross-host version findings."""
    checks = []
    py = result.get("python") or {}
    problem = problems["python"] or _too_old(py.get("version"))
    checks.append(Check("python", problem is None,
                        f"{py.get('executable')} {py.get('version')}"
                        + (f": {problem}" if problem else ""),
                        None if problem is None else REMOTE_PYTHON_HINT))
    torch = result.get("torch") or {}
    if torch.get("version") is None or (torch.get("error") and not torch.get("version")):
        checks.append(Check("torch", False, f"torch not importable by {py.get('executable')}: "
                            f"{torch.get('error', 'not installed')}",
                            f"pip install torch with that interpreter on {host}, or {REMOTE_PYTHON_HINT}"))
    elif torch.get("error"):
        checks.append(Check("torch", False, f"torch {torch['version']}: {torch['error']}",
                            f"reinstall torch on {host}"))
    else:
        build = torch.get("cuda_build")
        detail = f"{torch['version']}" + (f" (CUDA {build})" if build else " (CPU build)")
        problem = problems["torch"]
        checks.append(Check("torch", problem is None, detail + (f": {problem}" if problem else ""),
                            None if problem is None else
                            "install the same torch version on every node"))
    ds = result.get("dslaunch") or {}
    problem = problems["dslaunch"]
    if ds.get("version") is None:
        checks.append(Check("dslaunch", False, f"launcher not importable by {py.get('executable')} "
                            f"in {(result.get('workdir') or {}).get('path')}: {ds.get('error')}",
                            f"pip install dslaunch on {host} with that interpreter "
                            "(or share the checkout and PYTHONPATH)"))
    else:
        checks.append(Check("dslaunch", problem is None, f"{ds['version']} at {ds.get('path')}"
                            + (f": {problem}" if problem else ""),
                            None if problem is None else
                            "install the launcher's dslaunch version on every node"))
    if not request.fast:
        checks.append(gpu_check(result, slots, request.require_gpus))
    wd = result.get("workdir") or {}
    checks.append(Check("workdir", bool(wd.get("exists")),
                        f"{wd.get('path')}" + ("" if wd.get("exists") else " does not exist"),
                        None if wd.get("exists") else
                        "--workdir DIR that exists on every node (a shared or identical tree)"))
    script = result.get("script")
    if script is not None and not request.fast:
        checks.append(Check("script", bool(script.get("exists")),
                            f"{script.get('path')}" + ("" if script.get("exists") else
                                                       f" not found in {wd.get('path')}"),
                            None if script.get("exists") else
                            "put the script on every node at the same path (shared filesystem)"))
    return checks


def rendezvous_check(result: dict, addr: str, port: int, token_seen: bool | None) -> Check:
    """Could this node open a TCP connection to MASTER_ADDR:port, and did it reach our listener?"""
    route = result.get("route") or {}
    via = f"via {route.get('interface') or '?'} ({route.get('source', '?')})"
    if route.get("error"):
        return Check("rendezvous", False, route["error"],
                     "set --master_addr to an address of the first node that every node reaches")
    connect = result.get("connect") or {}
    if not connect.get("ok"):
        return Check("rendezvous", False, f"cannot connect to {addr}:{port} {via}: "
                     f"{connect.get('error', 'not tried')}",
                     f"a firewall between this node and {addr}, or MASTER_ADDR is not reachable "
                     "from here: open the port or set --master_addr")
    if token_seen is False:
        return Check("rendezvous", False, f"connected to {addr}:{port} {via}, but not to our "
                     "listener on the first node (another machine answers at that address)",
                     "set --master_addr to the first node's address on the nodes' network")
    return Check("rendezvous", True, f"reached {addr}:{port} {via}")


def master_port_check(listening: dict | None, host: str, port: int) -> Check:
    if listening is None:
        return Check("master_port", False, f"no answer from the probe on {host}", None)
    if listening.get("ok") and port == 0:
        return Check("master_port", True, f"free ports exist on {host} "
                     f"(the check listened on {listening.get('port')})")
    if listening.get("ok"):
        return Check("master_port", True, f"port {port} is free on {host}")
    owner = listening.get("owner")
    return Check("master_port", False, f"port {port} is taken on {host}"
                 + (f" by {owner}" if owner else "") + f" ({listening.get('error')})",
                 f"pick another with --master_port N (0 picks a free one), or stop what holds it: "
                 f"ssh {host} ss -ltnp 'sport = :{port}'")
