"""Another user on a node: connect to dslaunch with what an agent's command line shows.

  thief.py ARGV_JSON NODE_RANK   ARGV_JSON: the agent's argv as read from /proc/PID/cmdline

Prints one JSON line: the message types dslaunch sent before it closed the connection.
"""
import hashlib
import hmac
import json
import socket
import sys

argv, node_rank = json.loads(sys.argv[1]), int(sys.argv[2])
address = argv[argv.index("--connect") + 1]
key = argv[argv.index("--ticket") + 1] if "--ticket" in argv else "guess"
host, _, port = address.rpartition(":")
sock = socket.create_connection((host, int(port)), timeout=10)
reader = sock.makefile("rb")
seen = []
challenge = json.loads(reader.readline())
seen.append(challenge["type"])
message = f"dslaunch-hello\n{challenge['nonce']}\n{node_rank}".encode()
proof = hmac.new(key.encode(), message, hashlib.sha256).hexdigest()
sock.sendall((json.dumps({"type": "hello", "node_rank": node_rank, "proof": proof, "hostname": "thief",
                          "pid": 1}) + "\n").encode())
try:
    for line in reader:
        seen.append(json.loads(line).get("type"))
except OSError:
    pass
print(json.dumps(seen))
