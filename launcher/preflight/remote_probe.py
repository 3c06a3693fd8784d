"""The probe dslaunch runs on every node in one round trip (sent as text over ssh).

It reads PARAMS (JSON, prepended by the sender), prints JSON lines on stdout and
exits: {"event": "listening", ...} (first node only), {"event": "result", ...},
and, on the first node after its stdin closes, {"event": "tokens", ...}.
Torch-free unless the node has NVIDIA devices and a full check was asked for.
Plain Python 3.6+ so that an old interpreter still reports its own version.
"""
import binascii
import errno
import json
import os
import socket
import subprocess
import sys
import threading
import time

PARAMS = globals().get("PARAMS") or json.loads(os.environ.get("DSLAUNCH_PROBE_PARAMS", "{}"))


def emit(event, **data):
    data["event"] = event
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


def port_owner(port):
    """'pid 123 (python3 -m http.server)' for the process listening on TCP `port`, or ''."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(cols[9])
        except (OSError, IndexError, ValueError, StopIteration):
            pass
    for pid in (p for p in os.listdir("/proc") if p.isdigit()) if inodes else ():
        try:
            for fd in os.listdir("/proc/%s/fd" % pid):
                target = os.readlink("/proc/%s/fd/%s" % (pid, fd))
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    with open("/proc/%s/cmdline" % pid, "rb") as f:
                        cmd = " ".join(f.read().replace(b"\0", b" ").decode(errors="replace").split())
                    return "pid %s (%s)" % (pid, cmd[:80])
        except OSError:
            continue
    return ""


class Listener(object):
    """The short-lived rendezvous listener on the first node: records the tokens it receives."""

    def __init__(self, port):
        self.tokens = []
        self.arrived = threading.Condition()
        self.sock = listening_socket(port)
        self.port = self.sock.getsockname()[1]  # the one picked when asked for port 0
        self.sock.settimeout(0.2)
        self.done = False
        self.thread = threading.Thread(target=self.serve)
        self.thread.daemon = True
        self.thread.start()

    def serve(self):
        while not self.done:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                conn.settimeout(2)
                data = b""
                while len(data) < 256:  # to EOF: the sender closes first, so the port
                    piece = conn.recv(256)  # keeps no TIME_WAIT here and the ranks can bind it
                    if not piece:
                        break
                    data += piece
                data = data.decode(errors="replace").strip()
                if data:
                    with self.arrived:
                        self.tokens.append(data)
                        self.arrived.notify_all()
            except OSError:
                pass
            finally:
                conn.close()

    def wait_for(self, expected, timeout):
        """Wait up to `timeout` s until every token in `expected` arrived; the tokens seen."""
        deadline = time.time() + timeout
        with self.arrived:
            while not set(expected) <= set(self.tokens) and time.time() < deadline:
                self.arrived.wait(max(0.0, deadline - time.time()))
            return list(self.tokens)

    def close(self):
        self.done = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes accept() at once on Linux
        except OSError:
            pass
        self.thread.join(1)
        self.sock.close()


def listening_socket(port):
    """TCP on every interface, IPv6 and IPv4 alike where the host has IPv6 (as torch's TCPStore)."""
    if socket.has_ipv6:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::", port))
            sock.listen(128)
            return sock
        except OSError as e:
            sock.close()
            if e.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                raise  # the port is taken: the finding
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("", port))
    sock.listen(128)
    return sock


def interface_for(ip):
    """Name of the local interface that holds address `ip` (IPv4 by ioctl, IPv6 by /proc), or None."""
    if ":" in ip:
        return _ipv6_interface(ip.split("%", 1)[0])
    try:
        import fcntl
        import struct
    except ImportError:
        return None
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == ip:
                return name
    finally:
        probe.close()
    return None


def _ipv6_interface(ip):
    try:
        wanted = binascii.hexlify(socket.inet_pton(socket.AF_INET6, ip)).decode()
        with open("/proc/net/if_inet6") as f:
            for line in f:
                cols = line.split()
                if len(cols) >= 6 and cols[0] == wanted:
                    return cols[5]
    except (OSError, ValueError):
        pass
    return None


def route_to(addr, port):
    """{'address': resolved, 'source': local ip, 'interface': name} toward MASTER_ADDR (IPv4 or IPv6)."""
    out = {"master_addr": addr}
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(addr, port or 9, 0, socket.SOCK_DGRAM)[0]
    except (OSError, IndexError) as e:
        out["error"] = "cannot resolve %s: %s" % (addr, e)
        return out
    out["address"] = sockaddr[0]
    udp = socket.socket(family, socket.SOCK_DGRAM)
    try:
        udp.connect(sockaddr)  # sends nothing: only picks the route
        out["source"] = udp.getsockname()[0]
    except OSError as e:
        out["error"] = "no route to %s: %s" % (out["address"], e)
        return out
    finally:
        udp.close()
    out["interface"] = interface_for(out["source"])
    if out["source"].startswith("127.") and out["address"] == out["source"]:
        out["interface"] = "lo"
    return out


def connect_to(addr, port, token, timeout):
    try:
        conn = socket.create_connection((addr, port), timeout=timeout)
    except OSError as e:
        return {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
    try:
        conn.sendall((token + "\n").encode())
    except OSError as e:
        return {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
    finally:
        conn.close()
    return {"ok": True}


def torch_facts(full):
    """torch version without importing it; CUDA facts by import only when GPUs may exist."""
    facts = {"version": None}
    try:
        import importlib.util
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        facts["error"] = "no module named 'torch'"
        return facts
    version_file = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    try:
        with open(version_file) as f:
            for line in f:
                key, _, value = line.partition("=")
                key, value = key.strip().split(":")[0].strip(), value.strip().strip("'\"")
                if key == "__version__":
                    facts["version"] = value
                elif key == "cuda":
                    facts["cuda_build"] = None if value == "None" else value
    except OSError as e:
        facts["error"] = "cannot read %s: %s" % (version_file, e)
    gpu_devices = os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")
    if full and gpu_devices:
        try:
            import torch
            facts["version"] = torch.__version__
            facts["cuda_available"] = bool(torch.cuda.is_available())
            facts["device_count"] = torch.cuda.device_count() if facts["cuda_available"] else 0
        except Exception as e:  # a broken torch install is a finding, not a crash
            facts["error"] = "import torch failed: %s: %s" % (type(e).__name__, e)
    return facts


def nvidia_smi_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             timeout=10, universal_newlines=True)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def dslaunch_facts():
    try:
        import launcher
    except Exception as e:
        return {"version": None, "error": "%s: %s" % (type(e).__name__, e)}
    return {"version": getattr(launcher, "__version__", None),
            "path": os.path.dirname(getattr(launcher, "__file__", "") or "")}


def open_listener(p):
    """The first node's rendezvous listener: (Listener or None, the 'listening' facts)."""
    try:
        listener = Listener(int(p["master_port"]))
        return listener, {"ok": True, "port": listener.port}
    except OSError as e:
        return None, {"ok": False, "error": str(e), "owner": port_owner(int(p["master_port"]))}


def collect(p, listener, as_the_ranks_will=True):
    """This node's facts for the checks. `as_the_ranks_will`: enter the workdir and take the
    ranks' PYTHONPATH and PATH first (the agent already runs there, so it only looks)."""
    full = bool(p.get("full"))
    result = {"python": {"executable": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3]}}
    workdir = p.get("workdir") or os.getcwd()
    result["workdir"] = {"path": workdir, "exists": os.path.isdir(workdir)}
    saved_path = list(sys.path)
    if as_the_ranks_will:
        if result["workdir"]["exists"]:
            os.chdir(workdir)
        if p.get("path"):
            os.environ["PATH"] = p["path"]
    # the ranks run in workdir with the forwarded PYTHONPATH
    sys.path[:0] = [x for x in (p.get("pythonpath") or "").split(os.pathsep) if x] + [workdir]
    try:
        if p.get("script"):
            result["script"] = {"path": p["script"], "exists": os.path.isfile(p["script"])}
        result["torch"] = torch_facts(full)
        result["dslaunch"] = dslaunch_facts()
    finally:
        if not as_the_ranks_will:
            sys.path[:] = saved_path
    if full:
        result["nvidia_smi_gpus"] = nvidia_smi_count()
    if p.get("master_addr"):
        result["route"] = route_to(p["master_addr"], int(p.get("master_port") or 0))
    if p.get("connect") and (listener is not None or not p.get("listen")):
        port = listener.port if listener is not None else int(p["master_port"])
        result["connect"] = connect_to(p["master_addr"], port, p.get("token", "?"),
                                       float(p.get("connect_timeout", 3)))
        result["connect"]["port"] = port
    return result


def main():
    p = PARAMS
    listener = None
    if p.get("listen"):
        listener, listening = open_listener(p)
        emit("listening", **listening)
    emit("result", **collect(p, listener))
    if listener is not None:
        deadline = time.time() + float(p.get("listen_deadline", 60))
        waiter = threading.Thread(target=sys.stdin.read)  # the sender closes stdin when done
        waiter.daemon = True
        waiter.start()
        waiter.join(max(0.0, deadline - time.time()))
        listener.close()
        emit("tokens", tokens=listener.tokens)


if __name__ == "__main__":
    main()
