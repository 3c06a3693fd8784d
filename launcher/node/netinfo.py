"""Which network interface leads to an address. Local lookups only: no packet is sent."""
from __future__ import annotations

import ipaddress
import socket

import psutil


def local_address_toward(addr: str, port: int = 9) -> str | None:
    """The source address this machine would use to reach `addr` (UDP connect sends nothing)."""
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_DGRAM)
    except socket.gaierror:
        return None
    for family, _type, _proto, _name, sockaddr in infos:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect(sockaddr)
                return probe.getsockname()[0]
            except OSError:
                continue
    return None


def interface_of(address: str) -> str | None:
    """The interface that holds `address`, e.g. 'eth0' for 10.0.0.5."""
    try:
        wanted = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    if wanted.is_loopback:
        for name, addrs in psutil.net_if_addrs().items():
            if any(a.address.startswith("127.") or a.address == "::1" for a in addrs):
                return name
    for name, addrs in psutil.net_if_addrs().items():
        for item in addrs:
            try:
                if ipaddress.ip_address(item.address.split("%", 1)[0]) == wanted:
                    return name
            except ValueError:
                continue
    return None


def interface_toward(addr: str) -> str | None:
    """The interface through which this machine reaches `addr`."""
    source = local_address_toward(addr)
    return interface_of(source) if source else None
