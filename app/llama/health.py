"""Talking to a running llama-server: GET /health (503 while loading, 200 when ready) and /metrics."""

from __future__ import annotations

import socket

# A raw HTTP/1.0 GET: http.client (and the email package it drags in) would add tens of
# milliseconds to every `board serve start` and to each supervisor's start.


def probe_host(host: str) -> str:
    """Where to reach a server that listens on `host`: the loopback for the wildcard addresses."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def _get(host: str, port: int, path: str, timeout: float, key: str | None = None) -> tuple[int, bytes] | None:
    """(status, body) of GET path (with the server's API key when given), or None when nothing (or no HTTP) answers."""
    target = probe_host(host)
    try:
        with socket.create_connection((target, port), timeout=timeout) as conn:
            name = f"[{target}]" if ":" in target else target
            auth = f"Authorization: Bearer {key}\r\n" if key else ""
            conn.sendall(f"GET {path} HTTP/1.0\r\nHost: {name}:{port}\r\n{auth}Connection: close\r\n\r\n".encode())
            chunks = []
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError:
        return None
    data = b"".join(chunks)
    head, _, body = data.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/") or not status_line[1].isdigit():
        return None
    return int(status_line[1]), body


def health(host: str, port: int, timeout: float = 1.0) -> int | None:
    """The HTTP status of GET /health, or None when nothing answers."""
    result = _get(host, port, "/health", timeout)
    return None if result is None else result[0]


def metrics(host: str, port: int, timeout: float = 1.0, key: str | None = None) -> dict[str, float] | None:
    """Prometheus samples from /metrics ({'llamacpp:tokens_predicted_total': 123.0, ...}); None when the
    server does not answer, was started without --metrics, or wants its API key (`key`) and did not get it."""
    result = _get(host, port, "/metrics", timeout, key)
    if result is None or result[0] != 200:
        return None
    samples: dict[str, float] = {}
    for line in result[1].decode("utf-8", "replace").splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            samples[name.strip()] = float(value)
        except ValueError:
            continue
    return samples


class TokenRate:
    """Generated tokens per second between two /metrics samples (what the Servers panel shows)."""

    COUNTER = "llamacpp:tokens_predicted_total"

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None

    def update(self, samples: dict[str, float] | None, now: float) -> float | None:
        if not samples or self.COUNTER not in samples:
            self._last = None
            return None
        count = samples[self.COUNTER]
        last, self._last = self._last, (now, count)
        if last is None or now <= last[0] or count < last[1]:
            return None
        return (count - last[1]) / (now - last[0])
