"""How an agent proves to dslaunch that it was started by this job, without sending its secret.

dslaunch opens each connection with a fresh random challenge; the agent answers with
HMAC-SHA256(key, challenge, node rank). A listener on the path sees a challenge and an
answer that are worth nothing for the next connection. The key reaches the agent off the
command line where the runner allows it (see `DELIVERIES`); only pdsh, which cannot, puts a
one-time ticket there, and dslaunch accepts it once per node, from that node's address.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

SECRET_ENV = "DSLAUNCH_AGENT_SECRET"   # where srun and mpirun carry the key (their env propagation)
DELIVERIES = {
    "stdin": "ssh writes the node's own key on the connection's standard input",
    "env": f"the runner's environment propagation carries ${SECRET_ENV} (srun --export, mpirun -x)",
    "ticket": "a one-time ticket on the command line: accepted once per node, from the node's address",
}


def new_nonce() -> str:
    return secrets.token_hex(16)


def proof(key: str, nonce: str, node_rank: int) -> str:
    """The agent's answer to dslaunch's challenge."""
    message = f"dslaunch-hello\n{nonce}\n{node_rank}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def node_key(job_secret: str, node_rank: int) -> str:
    """A key for one node, derived from the job's secret (holding it proves nothing for another node)."""
    return hmac.new(job_secret.encode(), f"node {node_rank}".encode(), hashlib.sha256).hexdigest()


def agent_secret_args(delivery: str, ticket: str) -> list[str]:
    """What the agent is told on its command line about where its key is (never the key itself,
    except pdsh's one-time ticket)."""
    if delivery == "stdin":
        return ["--secret", "stdin"]
    if delivery == "env":
        return ["--secret", f"env:{SECRET_ENV}"]
    return ["--ticket", ticket]


def read_agent_key(secret: str | None, ticket: str | None, stdin, environ: dict) -> str:
    """The agent's key from `--secret stdin|env:NAME` or `--ticket T`; the env variable is removed
    from `environ` so the ranks never inherit it. Raises ValueError when it is missing."""
    if ticket:
        return ticket
    if secret == "stdin":
        key = stdin.readline().strip()
    elif secret and secret.startswith("env:"):
        key = environ.pop(secret[4:], "").strip()
    else:
        raise ValueError(f"unknown --secret source '{secret}' (stdin or env:NAME)")
    if not key:
        raise ValueError(f"no key found in {secret}")
    return key


@dataclass
class Credentials:
    """dslaunch's side: the job's secret, how it is delivered, and which nodes have been admitted."""

    delivery: str
    job_secret: str = field(default_factory=lambda: secrets.token_hex(32))
    ticket: str = field(default_factory=lambda: secrets.token_hex(16))
    admitted: set = field(default_factory=set)

    def key_for(self, node_rank: int) -> str:
        if self.delivery == "stdin":
            return node_key(self.job_secret, node_rank)
        if self.delivery == "env":
            return self.job_secret
        return self.ticket

    def stdin_for(self, node_rank: int) -> bytes:
        """What the ssh runner writes on node `node_rank`'s standard input."""
        return (self.key_for(node_rank) + "\n").encode()

    def runner_env(self) -> dict[str, str]:
        """Variables for the runner's own environment (srun and mpirun pass them on)."""
        return {SECRET_ENV: self.job_secret} if self.delivery == "env" else {}

    def check(self, hello: dict | None, nonce: str, source: str, expected: dict[int, set[str]],
              node_count: int) -> str | None:
        """Why this hello is refused, or None (and the node is admitted; admit once per node)."""
        if not isinstance(hello, dict) or hello.get("type") != "hello":
            return "no hello"
        node_rank = hello.get("node_rank")
        if type(node_rank) is not int or not 0 <= node_rank < node_count:
            return f"bad node rank {node_rank!r}"
        answer = hello.get("proof")
        if not isinstance(answer, str) or not hmac.compare_digest(answer, proof(self.key_for(node_rank), nonce,
                                                                                 node_rank)):
            return f"wrong proof for node {node_rank}"
        if node_rank in self.admitted:
            return f"node {node_rank} already said hello (a second hello is never admitted)"
        addresses = expected.get(node_rank)
        if self.delivery == "ticket" and addresses and source not in addresses:
            return (f"node {node_rank}'s ticket used from {source}, not from the node "
                    f"({', '.join(sorted(addresses))}); if that is the node's other interface, "
                    "use --launcher ssh")
        self.admitted.add(node_rank)
        return None
