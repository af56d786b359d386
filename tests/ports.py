"""Port ranges for the llama servers tests start ([llama] port_min and port_max).

A band for each kind of test, all below the kernel's ephemeral ports (32768 and up, what bind(0) hands out), and
a slot in the band for each process: the workers of one parallel run (pytest-xdist) take consecutive slots from a
start drawn from the run's id, so they never share a range; a run without xdist takes its slot from its pid. Other
test runs on the same host land elsewhere by chance, as before.
"""

from __future__ import annotations

import os
import zlib

BANDS = {  # name: (first port, ports in the band)
    "llama": (20000, 6000),  # tests/llama's Board: the real CLI on a fresh database
    "llama_service": (26000, 2000),  # tests/llama/test_servers_service.py: servers through the agent
    "llama_users": (28000, 2000),  # tests/users/test_llama_users.py
    "permissions": (30000, 2000),  # tests/users/test_permissions.py
    "gateway": (32000, 700),  # tests/gateway: the gateway's listen port and its servers
}


def port_range(band: str, size: int) -> tuple[int, int]:
    """(port_min, port_max): `size` ports of `band` that no other worker of this run uses."""
    first, width = BANDS[band]
    slots = width // size
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ...
    if worker:
        slot = zlib.crc32(os.environ.get("PYTEST_XDIST_TESTRUNUID", "").encode()) + int(worker.removeprefix("gw"))
    else:
        slot = os.getpid()
    base = first + (slot % slots) * size
    return base, base + size - 1
