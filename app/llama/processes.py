"""Servers as GPU processes, for the simulated fleet: in demo mode a server really runs (on the CPU),
and the board shows it on its booked cards the way NVML would show a CUDA process."""

from __future__ import annotations

import os
import sqlite3

from app.gpu.model import GpuProcess
from app.llama import rows
from app.llama.identity import ProcessIdentity, check

CONTEXT_MIB = 256  # CUDA context and compute buffers, roughly


def processes_of(servers) -> dict[int, tuple[GpuProcess, ...]]:
    """{card index: processes} for these servers, those whose llama-server still runs (identity checked)."""
    found: dict[int, tuple[GpuProcess, ...]] = {}
    for server in servers:
        if not server.live:
            continue
        if server.pid is None or not server.cards:
            continue
        if check(ProcessIdentity(server.pid, server.pid_started, server.cmdline)) not in ("match", "hidden"):
            continue
        try:
            model_mib = os.path.getsize(server.model) / 2**20
        except OSError:
            model_mib = 0
        share = round(model_mib / len(server.cards)) + CONTEXT_MIB
        process = GpuProcess(pid=server.pid, used_mib=share, user=server.user, uid=server.uid,
                             command=" ".join(server.cmdline), started_at=server.pid_started)
        for card in server.cards:
            found[card] = found.get(card, ()) + (process,)
    return found


def feed_simulated(source, conn: sqlite3.Connection) -> bool:
    """Show live servers on a simulated source's cards; False (and nothing done) for a real source."""
    return show_on_simulated(source, rows.live(conn))


def show_on_simulated(source, servers) -> bool:
    """Show these servers (the live ones) on a simulated source's cards; False for a real source."""
    if not getattr(source, "simulated", False) or not hasattr(source, "set_extra_processes"):
        return False
    count = len(source.scenario.cards) if hasattr(source, "scenario") else None
    mapping = processes_of(servers)
    if count is not None:
        mapping = {card: procs for card, procs in mapping.items() if 0 <= card < count}
    source.set_extra_processes(mapping)
    return True
