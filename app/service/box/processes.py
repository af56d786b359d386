"""Processes the service may signal: only those the kernel told it about.

A `board run` job (and a llama-server supervisor) connects and registers for a booking. The
service takes its pid and uid from SO_PEERCRED, opens a pidfd for it at once and checks, through
/proc, that the process behind the pidfd still has that uid: a pid reused between connect and
pidfd_open would fail that check. From then on the pidfd is the only handle it signals through;
members of the process's group are signalled through pidfds of their own, and only when they
belong to the booking's holder alone (every uid of theirs is the holder's: nothing running setuid).
It never signals pid <= 1 or its own process group.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Final, Literal

from app.model import Booking


class _Unread(Enum):
    UNREAD = "unread"


UNREAD: Final = _Unread.UNREAD  # a Registration's booking before the enforcer's first read


@dataclass
class Registration:
    id: int
    kind: str  # job | server
    booking_id: int
    uid: int
    pid: int
    pgid: int
    pidfd: int
    registered_at: float
    cards: tuple[str, ...] = ()  # the booking's card uuids when it registered: work on them, and only them
    started_ticks: int = 0  # the process's start time (/proc/PID/stat), which with the pid names it for good
    term_sent_at: float | None = None
    warned: bool = False
    # Its booking as the enforcer last read it (a Booking, or None: gone), which enforces it while the database is
    # unreachable; UNREAD until the first read (app.service.box.enforce).
    known: Booking | None | Literal[_Unread.UNREAD] = UNREAD
    connected: bool = True
    done: bool = field(default=False)


class RegistrationError(Exception):
    pass


def owned_by(pid: int, uid: int) -> bool:
    """The process is wholly `uid`'s: its real, effective, saved and filesystem uids are all `uid`. A program
    a member started that runs setuid (another user's binary with the setuid bit, such as passwd) keeps
    the member's real uid, but is not the member's alone, so it is never theirs to have signalled."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"Uid:"):
                    uids = [int(field) for field in line.split()[1:]]
                    return len(uids) == 4 and all(found == uid for found in uids)
    except (OSError, ValueError):
        return False
    return False


def proc_pgid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return int(fields[2])
    except (OSError, ValueError, IndexError):
        return None


def proc_started(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (/proc/PID/stat field 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def exited(pidfd: int) -> bool:
    """A pidfd polls readable once its process has exited. (poll, not select: descriptors pass 1024.)"""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


class Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0
        self.entries: dict[int, Registration] = {}

    def add(self, kind: str, booking_id: int, uid: int, pid: int, cards: tuple[str, ...] = (),
            started_ticks: int | None = None, pgid: int | None = None) -> Registration:
        """Hold a pidfd for `pid`. With `started_ticks` (adopting a job a restarted service knew), the process
        must still be the one that registered: same start time, same uid."""
        if pid <= 1:
            raise RegistrationError("that process cannot be registered")
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            raise RegistrationError("the registering process has already ended") from None
        # The pidfd now pins the process: check that it is the caller's, so a reused pid cannot slip in.
        started = proc_started(pid)
        if not owned_by(pid, uid) or exited(pidfd) or started is None or started_ticks not in (None, started):
            os.close(pidfd)
            raise RegistrationError("the registering process is not yours")
        pgid = pgid or proc_pgid(pid) or pid
        with self._lock:
            self._next += 1
            entry = Registration(self._next, kind, booking_id, uid, pid, pgid, pidfd, time.time(), tuple(cards),
                                 started)
            self.entries[entry.id] = entry
        return entry

    def disconnected(self, entry: Registration) -> None:
        entry.connected = False  # the process keeps its pidfd watch: it may only have closed the socket

    def sweep(self) -> list[Registration]:
        """Forget registrations whose process has exited; returns them."""
        gone = []
        with self._lock:
            for entry in list(self.entries.values()):
                if exited(entry.pidfd):
                    os.close(entry.pidfd)
                    entry.done = True
                    gone.append(self.entries.pop(entry.id))
        return gone

    def jobs_of(self, booking_id: int) -> list[int]:
        """The pids of the live `board run` jobs registered for a booking."""
        return [entry.pid for entry in self.live() if entry.kind == "job" and entry.booking_id == booking_id
                and not exited(entry.pidfd)]

    def live(self) -> list[Registration]:
        with self._lock:
            return list(self.entries.values())

    def signal(self, entry: Registration, sig: int) -> list[int]:
        """Signal the registered process through its pidfd, then the rest of the job: the holder's processes
        that descend from it and, when it leads its own process group (as a shell gives a job), that group.

        A job started in the background of a script shares the script's group without leading it; then
        only its descendants count, so the script itself is never stopped. Nothing in the service's own
        group is signalled but a registered process, which its pidfd pins."""
        own_group = os.getpgrp()
        leads = entry.pgid == entry.pid and entry.pgid > 1 and entry.pgid != own_group
        # Found first: once the job has died, its children belong to init and no longer look like its own.
        members = sorted(_job_members(entry.pid, entry.pgid if leads else None) - {entry.pid})
        sent = []
        # Still the holder's alone: a job that exec'd something setuid since is no longer theirs to stop.
        if entry.pid > 1 and not exited(entry.pidfd) and owned_by(entry.pid, entry.uid):
            try:
                signal.pidfd_send_signal(entry.pidfd, sig)
                sent.append(entry.pid)
            except ProcessLookupError:
                pass
        for pid in members:
            if pid <= 1:
                continue
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            try:  # checked through the pidfd's process: a pid reused meanwhile is not the job's
                if owned_by(pid, entry.uid) and proc_pgid(pid) != own_group and not exited(fd):
                    signal.pidfd_send_signal(fd, sig)
                    sent.append(pid)
            except ProcessLookupError:
                pass
            finally:
                os.close(fd)
        return sent

    def close(self) -> None:
        with self._lock:
            for entry in self.entries.values():
                os.close(entry.pidfd)
            self.entries.clear()


def _job_members(root: int, pgid: int | None) -> set[int]:
    """The processes that descend from `root`, and those in process group `pgid` when given."""
    parents: dict[int, list[int]] = {}
    members: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid, ppid, group = int(name), int(fields[1]), int(fields[2])
        parents.setdefault(ppid, []).append(pid)
        if pgid is not None and group == pgid:
            members.add(pid)
    todo, seen = [root], {root}
    while todo:
        for child in parents.get(todo.pop(), ()):
            if child not in seen:  # /proc is read while processes come and go: never loop
                seen.add(child)
                members.add(child)
                todo.append(child)
    return members
