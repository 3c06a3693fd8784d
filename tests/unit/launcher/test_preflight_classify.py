"""Connection failures are told apart, each with the hint that fixes it."""
import errno
import socket

import pytest

from launcher.preflight.classify import (AUTH, HOSTKEY_CHANGED, HOSTKEY_UNKNOWN, SshFailure,
                                         classify)
from launcher.preflight.target import SshTarget

TARGET = SshTarget(alias="node2", hostname="10.9.0.2", port=22, user="root",
                   known_hosts_files=("/k/known_hosts",))
ON_2222 = SshTarget(alias="node2", hostname="10.9.0.2", port=2222, user="bob")


@pytest.mark.parametrize("error, detail, hint", [
    (socket.gaierror(-2, "Name or service not known"),
     "host name '10.9.0.2' does not resolve (Name or service not known)", "in the hostfile"),
    (ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
     "connection refused by 10.9.0.2:22", "start sshd on node2"),
    (socket.timeout("timed out"), "timed out after 5 s connecting to 10.9.0.2:22", "ssh -v root@node2"),
    (TimeoutError(), "timed out after 5 s", "firewall"),
    (OSError(errno.EHOSTUNREACH, "No route to host"), "10.9.0.2:22 is unreachable (No route to host)",
     "no route"),
    (OSError(errno.ETIMEDOUT, "Connection timed out"), "timed out after 5 s", "firewall"),
    (SshFailure(AUTH, {"allowed": ["publickey"], "tried": ["publickey /k/id_ed25519"],
                       "key_files": ["/k/id_ed25519"]}),
     "authentication failed for root@10.9.0.2:22 (server allows: publickey; tried: publickey /k/id_ed25519)",
     "ssh-copy-id -i /k/id_ed25519 root@node2"),
    (SshFailure(HOSTKEY_UNKNOWN, {"key_type": "ssh-ed25519", "fingerprint": "SHA256:abc"}),
     "host key of 10.9.0.2:22 is not in known_hosts (ssh-ed25519 SHA256:abc)",
     "ssh-keyscan 10.9.0.2 >> /k/known_hosts"),
    (SshFailure(HOSTKEY_CHANGED, {"fingerprint": "SHA256:new", "known_fingerprint": "SHA256:old"}),
     "HOST KEY CHANGED for 10.9.0.2:22: it offers SHA256:new, known_hosts has SHA256:old",
     "ssh-keygen -R 10.9.0.2 && ssh-keyscan 10.9.0.2 >> /k/known_hosts"),
    (EOFError("server closed"), "ssh to 10.9.0.2:22 failed: EOFError: server closed", "ssh -v"),
])
def test_each_kind_has_its_own_detail_and_hint(error, detail, hint):
    check = classify(error, TARGET, 5.0)
    assert (check.name, check.ok) == ("ssh", False)
    assert check.detail.startswith(detail), check.detail
    assert hint in check.hint, check.hint


def test_hints_carry_a_non_default_port_and_user():
    auth = classify(SshFailure(AUTH, {"allowed": ["publickey"], "tried": []}), ON_2222, 5)
    assert "ssh-copy-id -p 2222 bob@node2" in auth.hint
    assert "tried: no keys" in auth.detail
    changed = classify(SshFailure(HOSTKEY_CHANGED, {}), ON_2222, 5)
    assert "ssh-keygen -R '[10.9.0.2]:2222'" in changed.hint
    assert "ssh-keyscan -p 2222 10.9.0.2" in changed.hint
    assert "ssh -v -p 2222 bob@node2" in classify(socket.timeout(), ON_2222, 5).hint


def test_kinds_are_distinct():
    errors = [socket.gaierror(-2, "x"), ConnectionRefusedError(), socket.timeout(),
              SshFailure(AUTH, {}), SshFailure(HOSTKEY_UNKNOWN, {}), SshFailure(HOSTKEY_CHANGED, {})]
    hints = {classify(e, TARGET, 5).hint for e in errors}
    assert len(hints) == len(errors)
