"""Another user on a node: connect to dslaunch with what an agent's command line shows.

  thief.py ARGV_JSON NODE_RANK   ARGV_JSON: the agent's argv as read from /proc/PID/cmdline

Prints one JSON line: the message types dslaunch sent before it closed the connection.
"""
import hashlib
import hmac
import json
import socket
import sys
import time

argv, node_rank = json.loads(sys.argv[1]), int(sys.argv[2])
address = argv[argv.index("--connect") + 1]
host, _, port = address.rpartition(":")
sock = socket.create_connection((host, int(port)), timeout=3)
reader = sock.makefile("rb")
seen = []
hello = {"type": "hello", "node_rank": node_rank, "hostname": "thief", "pid": 1}
if "--token" in argv:  # an agent that shows its whole token (dslaunch before issue 18): just say it
    hello["token"] = argv[argv.index("--token") + 1]
else:
    challenge = json.loads(reader.readline())
    seen.append(challenge["type"])
    key = argv[argv.index("--ticket") + 1] if "--ticket" in argv else "guess"
    message = f"dslaunch-hello\n{challenge['nonce']}\n{node_rank}".encode()
    hello["proof"] = hmac.new(key.encode(), message, hashlib.sha256).hexdigest()
sock.sendall((json.dumps(hello) + "\n").encode())
end = time.monotonic() + 3   # listen a while: what would dslaunch tell us as that node?
try:
    while time.monotonic() < end:
        line = reader.readline()
        if not line:
            break
        seen.append(json.loads(line).get("type"))
except OSError:
    pass
print(json.dumps(seen))
