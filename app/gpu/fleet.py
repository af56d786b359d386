"""One reader of the GPUs for everyone: the newest snapshot, read again only when it is older than the refresh period."""

from __future__ import annotations

import threading
import time
from typing import Callable

from app.gpu import GpuSource
from app.gpu.model import FleetSnapshot


class Fleet:
    def __init__(self, source: GpuSource, refresh_seconds: float, clock: Callable[[], float] = time.monotonic):
        self.source, self.refresh_seconds, self.clock = source, refresh_seconds, clock
        self._lock = threading.Lock()
        self._latest: FleetSnapshot | None = None
        self._read_at = float("-inf")
        self.reads = 0  # NVML reads so far: the benchmark checks they do not grow with the boards

    @property
    def simulated(self) -> bool:
        return self.source.simulated

    def latest(self) -> FleetSnapshot:
        """A snapshot no older than the refresh period; concurrent askers share one read."""
        with self._lock:
            if self._latest is None or self.clock() - self._read_at >= self.refresh_seconds:
                self._latest = self.source.read()
                self._read_at = self.clock()
                self.reads += 1
            return self._latest

    def invalidate(self) -> None:
        """The next `latest()` reads again (the simulated fleet just gained a server's process)."""
        with self._lock:
            self._read_at = float("-inf")

    def cached(self) -> FleetSnapshot | None:
        return self._latest

    def close(self) -> None:
        self.source.close()
