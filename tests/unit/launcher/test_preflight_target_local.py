"""Resolving ssh settings from `ssh -G` output, and the local launcher-program checks."""
import subprocess
from types import SimpleNamespace

from launcher.preflight.local import launcher_tool_check
from launcher.preflight.target import parse_ssh_g, target_from_options

SSH_G = """user root
hostname 10.213.0.1
port 22
identitiesonly yes
stricthostkeychecking ask
identityfile /k/id_ed25519
identityfile ~/.ssh/id_rsa
globalknownhostsfile /etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2
userknownhostsfile /k/known_hosts
proxyjump none
"""


def test_target_from_ssh_g():
    t = target_from_options("node1", parse_ssh_g(SSH_G))
    assert (t.hostname, t.port, t.user, t.identities_only) == ("10.213.0.1", 22, "root", True)
    assert t.identity_files[0] == "/k/id_ed25519" and not t.identity_files[1].startswith("~")
    assert t.known_hosts_files == ("/k/known_hosts", "/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
    assert t.proxy_command is None
    assert t.destination == "root@10.213.0.1:22"


def test_explicit_user_and_port_win_and_proxyjump_becomes_a_proxy_command():
    options = parse_ssh_g(SSH_G.replace("proxyjump none", "proxyjump bastion"))
    t = target_from_options("node1", options, user="bob", port=2222)
    assert (t.user, t.port) == ("bob", 2222)
    assert t.proxy_command == "ssh -W %h:%p bastion"
    assert t.ssh_words == "-p 2222 bob@node1"


def _which(present):
    return lambda name: f"/usr/bin/{name}" if name in present else None


def _run(stdout):
    return lambda argv, **kw: SimpleNamespace(stdout=stdout, stderr="", returncode=0)


def test_pdsh_needs_its_ssh_module_and_ssh():
    good = launcher_tool_check("pdsh", _which({"pdsh", "ssh"}), _run("Module: rcmd/ssh\n"))
    assert good.ok and good.name == "pdsh"
    missing = launcher_tool_check("pdsh", _which({"ssh"}), _run(""))
    assert not missing.ok and "apt-get install pdsh" in missing.hint
    no_module = launcher_tool_check("pdsh", _which({"pdsh", "ssh"}), _run("Module: rcmd/rsh\n"))
    assert not no_module.ok and "pdsh-rcmd-ssh" in no_module.hint
    no_ssh = launcher_tool_check("pdsh", _which({"pdsh"}), _run("Module: rcmd/ssh\n"))
    assert not no_ssh.ok and "openssh-client" in no_ssh.hint

    def broken(argv, **kw):
        raise subprocess.TimeoutExpired(argv, 5)
    assert not launcher_tool_check("pdsh", _which({"pdsh", "ssh"}), broken).ok


def test_other_launchers():
    assert launcher_tool_check("local", _which(set())) is None
    assert launcher_tool_check("openmpi", _which({"mpirun"})).name == "mpirun"
    mpi = launcher_tool_check("openmpi", _which(set()))
    assert not mpi.ok and "openmpi-bin" in mpi.hint
    srun = launcher_tool_check("slurm", _which(set()))
    assert srun.name == "srun" and not srun.ok and "salloc" in srun.hint
    assert launcher_tool_check("ssh", _which({"ssh"})).name == "ssh_client"


class _Recorder:
    def __init__(self, rc=0, stderr=""):
        self.rc, self.stderr, self.calls = rc, stderr, []

    def __call__(self, argv, **kw):
        self.calls.append((argv, kw.get("env") or {}))
        return SimpleNamespace(returncode=self.rc, stdout="", stderr=self.stderr)


def test_client_check_runs_pdsh_like_the_runner_and_appends_to_ssh_args():
    from launcher.preflight.local import client_check

    run = _Recorder()
    host = SimpleNamespace(name="node2", user="bob", port=None)
    check = client_check("pdsh", host, 2222, 5, run, environ={"PDSH_SSH_ARGS_APPEND": "-vv"})
    argv, env = run.calls[0]
    assert argv == ["pdsh", "-R", "ssh", "-S", "-t", "5", "-w", "bob@node2", "true"]
    assert env["PDSH_SSH_ARGS_APPEND"] == "-vv -o BatchMode=yes -o ConnectTimeout=5 -p 2222"
    assert check.ok and check.name == "pdsh"


def test_client_check_reports_what_openssh_said():
    from launcher.preflight.local import client_check

    run = _Recorder(255, "node2: root@10.0.0.2: Permission denied (publickey).\n"
                         "pdsh@vm: node2: ssh exited with exit code 255\n")
    check = client_check("ssh", SimpleNamespace(name="node2", user=None, port=None), None, 5, run,
                         environ={})
    assert run.calls[0][0] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "node2", "true"]
    assert not check.ok and check.name == "ssh_client"
    assert check.detail.endswith("(exit 255): node2: root@10.0.0.2: Permission denied (publickey).")
    assert "BatchMode=yes node2 true" in check.hint
    assert client_check("openmpi", SimpleNamespace(name="n"), None, 5, run) is None


def test_paramiko_fallback_reads_ssh_config(tmp_path, monkeypatch):
    from launcher.preflight.target import _resolve_with_paramiko

    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(
        "Host w1\n  HostName 10.1.2.3\n  User alice\n  Port 2200\n  IdentityFile ~/.ssh/k1\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    t = _resolve_with_paramiko("w1", None, None)
    assert (t.hostname, t.user, t.port) == ("10.1.2.3", "alice", 2200)
    assert t.identity_files == (str(tmp_path / ".ssh" / "k1"),)
    assert t.known_hosts_files[0] == str(tmp_path / ".ssh" / "known_hosts")
    plain = _resolve_with_paramiko("other", "bob", 22)
    assert (plain.hostname, plain.user, plain.port) == ("other", "bob", 22)
