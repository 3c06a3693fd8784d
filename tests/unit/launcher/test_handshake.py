"""The agent's hello (issue 18, point 2): an HMAC over dslaunch's challenge, admitted once per node."""
import io
import json
import socket

import pytest

from launcher.control.controller import Controller
from launcher.handshake import Credentials, node_key, proof, read_agent_key
from launcher.planning.hostfile import parse_hostfile
from launcher.planning.plan import LaunchOptions, Machine, build_plan

NODE_ADDRESSES = {0: {"10.0.0.1"}, 1: {"10.0.0.2"}}


def hello(key, nonce, node_rank):
    return {"type": "hello", "node_rank": node_rank, "proof": proof(key, nonce, node_rank)}


@pytest.mark.parametrize("delivery", ["stdin", "env", "ticket"])
def test_the_right_proof_is_admitted_once(delivery):
    credentials = Credentials(delivery)
    key = credentials.key_for(1)
    assert credentials.check(hello(key, "n1", 1), "n1", "10.0.0.2", NODE_ADDRESSES, 2) is None
    again = credentials.check(hello(key, "n2", 1), "n2", "10.0.0.2", NODE_ADDRESSES, 2)
    assert "already said hello" in again


@pytest.mark.parametrize("message, source, why", [
    (None, "10.0.0.1", "no hello"),
    ({"type": "output"}, "10.0.0.1", "no hello"),
    ({"type": "hello", "node_rank": 7, "proof": "x"}, "10.0.0.1", "bad node rank 7"),
    ({"type": "hello", "node_rank": True, "proof": "x"}, "10.0.0.1", "bad node rank True"),
    ({"type": "hello", "node_rank": "0", "proof": "x"}, "10.0.0.1", "bad node rank '0'"),
    ({"type": "hello", "node_rank": 0, "proof": "not-the-hmac"}, "10.0.0.1", "wrong proof for node 0"),
    ({"type": "hello", "node_rank": 0}, "10.0.0.1", "wrong proof for node 0"),
])
def test_bad_hellos_are_refused_with_a_reason(message, source, why):
    assert Credentials("stdin").check(message, "nonce", source, NODE_ADDRESSES, 2) == why


def test_an_answer_is_worth_nothing_for_another_challenge_or_node():
    credentials = Credentials("env")
    recorded = hello(credentials.key_for(0), "old-nonce", 0)
    assert credentials.check(recorded, "new-nonce", "10.0.0.1", NODE_ADDRESSES, 2) == "wrong proof for node 0"
    relabelled = {**recorded, "node_rank": 1}
    assert credentials.check(relabelled, "old-nonce", "10.0.0.2", NODE_ADDRESSES, 2) == "wrong proof for node 1"


def test_ssh_keys_are_per_node():
    credentials = Credentials("stdin")
    assert credentials.key_for(0) != credentials.key_for(1) == node_key(credentials.job_secret, 1)
    assert credentials.check(hello(credentials.key_for(0), "n", 1), "n", "10.0.0.2", NODE_ADDRESSES, 2)


def test_a_ticket_is_good_only_from_its_node():
    credentials = Credentials("ticket")
    stolen = hello(credentials.ticket, "n", 0)
    assert "not from the node (10.0.0.1)" in credentials.check(stolen, "n", "10.0.0.2", NODE_ADDRESSES, 2)
    assert credentials.check(stolen, "n", "10.0.0.1", NODE_ADDRESSES, 2) is None


def test_the_agent_reads_its_key_off_the_command_line_and_hides_it_from_the_ranks():
    environ = {"DSLAUNCH_AGENT_SECRET": "k1", "PATH": "/bin"}
    assert read_agent_key("env:DSLAUNCH_AGENT_SECRET", None, io.StringIO(), environ) == "k1"
    assert environ == {"PATH": "/bin"}
    assert read_agent_key("stdin", None, io.StringIO("k2\n"), {}) == "k2"
    with pytest.raises(ValueError, match="no key found in stdin"):
        read_agent_key("stdin", None, io.StringIO(""), {})


def local_controller(delivery):
    hosts = parse_hostfile("localhost slots=1\n127.0.0.1 slots=1\n", "h")
    machine = Machine(python="/py", cwd="/", environ={})
    return Controller(build_plan(hosts, LaunchOptions(script="t.py", launcher="ssh"), machine), delivery=delivery)


def say_hello(controller, key, node_rank):
    """Dial the controller as an agent would; the message types received until it closes or 1 s passes."""
    sock = socket.create_connection((controller.endpoint.host, controller.endpoint.port), timeout=1.0)
    reader = sock.makefile("rb")
    challenge = json.loads(reader.readline())
    sock.sendall((json.dumps(hello(key, challenge["nonce"], node_rank)) + "\n").encode())
    seen = [challenge["type"]]
    try:
        seen += [json.loads(line)["type"] for line in reader]
    except OSError:
        seen.append("still open")
    sock.close()
    return seen


def test_the_controller_refuses_and_logs_bad_and_repeated_hellos(capsys):
    controller = local_controller("stdin")
    try:
        assert controller.listener.getsockname()[0] == "127.0.0.1"   # not every interface
        assert say_hello(controller, "guess", 0) == ["challenge"]
        assert say_hello(controller, controller.credentials.key_for(0), 0) == ["challenge", "still open"]
        node_rank, message = controller.events.get(timeout=2)
        assert (node_rank, message["type"]) == (0, "hello")
        assert say_hello(controller, controller.credentials.key_for(0), 0) == ["challenge"]
    finally:
        controller.listener.close()
    err = capsys.readouterr().err
    assert "refused a connection from 127.0.0.1:" in err and "wrong proof for node 0; the job goes on" in err
    assert "node 0 already said hello" in err
