"""Process identity: pid + create time + command line, so that a reused PID is never signalled.

A PID is only a number the kernel hands out again. Before board signals a server it checks that
the process now behind that PID started at the recorded time with the recorded command line. The
process-group checks read /proc directly and skip zombies: an exited process that nobody has reaped
yet holds no memory, no port and no GPU, and where PID 1 does not reap orphans it never goes away.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Iterable, Literal

Verdict = Literal["match", "gone", "other", "hidden"]
# psutil derives create_time from the start tick (1/100 s); the same process always reads the same.
_START_TOLERANCE_S = 0.015


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    pid: int
    started: float | None  # psutil's create_time; None when it could not be read (never matches)
    cmdline: tuple[str, ...]


def capture(pid: int) -> ProcessIdentity | None:
    """The identity of a live process, or None when it is gone (or a zombie)."""
    import psutil  # start-up: psutil loads only where processes are looked at

    try:
        process = psutil.Process(pid)
        with process.oneshot():
            if process.status() == psutil.STATUS_ZOMBIE:
                return None
            return ProcessIdentity(pid, process.create_time(), tuple(process.cmdline()))
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return ProcessIdentity(pid, None, ())


def check(expected: ProcessIdentity) -> Verdict:
    """match: the same process still runs; gone: nothing (or a zombie) at that PID;
    other: a different process reuses the PID; hidden: it exists but cannot be inspected (hidepid)."""
    import psutil  # start-up: psutil loads only where processes are looked at

    if expected.started is None:
        return "gone" if not _exists(expected.pid) else "hidden"
    try:
        process = psutil.Process(expected.pid)
        with process.oneshot():
            if process.status() == psutil.STATUS_ZOMBIE:
                return "gone"
            started = process.create_time()
            cmdline = tuple(process.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return "gone"
    except psutil.AccessDenied:
        return "hidden"
    if abs(started - expected.started) > _START_TOLERANCE_S:
        return "other"
    if cmdline != expected.cmdline:
        return "other"
    return "match"


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses, so split after the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry.name))
    return members


def owns_group(pgid: int, identities: Iterable[ProcessIdentity]) -> bool:
    """True when one of `identities` still runs and still leads or belongs to process group `pgid`."""
    for identity in identities:
        if identity is None or check(identity) != "match":
            continue
        try:
            if os.getpgid(identity.pid) == pgid:
                return True
        except ProcessLookupError:
            continue
    return False


def signal_group(pgid: int, sig: int, identities: Iterable[ProcessIdentity]) -> bool:
    """Send `sig` to the group only when one of our recorded processes is verifiably in it.

    Returns False (and signals nothing) when none is: the group is gone or its number now belongs to
    someone else. PermissionError propagates: another user's server (the caller then asks its supervisor).
    """
    if not owns_group(pgid, identities):
        return False
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def exit_info(returncode: int) -> tuple[int | None, int | None]:
    """(exit_code, exit_signal) from a Popen returncode (negative: killed by that signal)."""
    if returncode < 0:
        return None, -returncode
    return returncode, None


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
