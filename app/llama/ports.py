"""Ports for servers: leased from the configured range, unique among live servers, checked free by binding."""

from __future__ import annotations

import errno
import socket


def bind_free(host: str, port: int) -> bool:
    """True when `port` can be bound on `host` now (as llama-server will: SO_REUSEADDR, so TIME_WAIT is free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
                return False
            raise
    return True


def candidates(port_min: int, port_max: int, leased: set[int], wanted: int | None = None) -> list[int]:
    """Ports to try, in order: the one asked for, or the range from the bottom, minus live servers' ports."""
    if wanted is not None:
        return [] if wanted in leased else [wanted]
    return [p for p in range(port_min, port_max + 1) if p not in leased]
