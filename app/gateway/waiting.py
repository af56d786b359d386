"""The requests waiting for a model's free slot, and the order in which they get one (app.gateway.routing admits).

The order: the key's class (CLASSES' order, online first); in a class, the project that used least against its share
(Usage: its gateway tokens, decayed, over its [[projects]] share); in a project, the member whose request got one of
the model's slots longest ago (round-robin across members, whatever keys they use); then first come. On a board
without [[projects]] every key's project is IMPLICIT, and the order is class, then turns, then first come, as before.

Each level is a heap whose entries are pushed again when their key changes, the stale ones skipped as they come up:
a request waits and is handed a slot in O(log n) (leaving early costs up to a member's cap more).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Hashable, Mapping, TypeVar

if TYPE_CHECKING:
    from app.gateway.routing import Upstream

T = TypeVar("T", bound=Hashable)


class Usage:
    """Each project's gateway tokens (prompt and completion) as its requests finish, halved every half-life.

    Tokens rather than requests: a slot is held as long as its tokens take, so a project of long prompts uses more of
    a server than one of short questions; and the project's budgets (tokens_per_day, tpm) count tokens too. Kept in
    memory, seeded as the gateway starts with what the service recorded (gateway_state's fair_use). Every project
    decays by the same factor, so their order changes only when tokens are added; each is kept as log2 of its tokens
    scaled to time 0 (the sum of tokens * 2^(t / half-life)), which orders them at any time and never overflows."""

    def __init__(self, half_life_s: float, shares: Mapping[str, float]) -> None:
        self.half_life_s, self.shares = half_life_s, dict(shares)
        self._scaled: dict[str, float] = {}  # project -> log2(sum of tokens * 2^(t / half_life_s))

    def add(self, project: str, tokens: float, now: float) -> None:
        if tokens <= 0:
            return
        new = math.log2(tokens) + now / self.half_life_s
        old = self._scaled.get(project, -math.inf)
        high, low = max(old, new), min(old, new)
        self._scaled[project] = high + math.log2(1 + 2 ** (low - high))  # log2(2^old + 2^new)

    def standing(self, project: str) -> float:
        """The project's place among the others (the least goes first): log2 of its decayed tokens over its share,
        give or take the decay, which is the same for all. A project the config does not name weighs 1."""
        return self._scaled.get(project, -math.inf) - math.log2(self.shares.get(project, 1.0))

    def tokens(self, project: str, now: float) -> float:
        """The project's decayed tokens at `now`."""
        return 2 ** (self._scaled.get(project, -math.inf) - now / self.half_life_s)


@dataclass(eq=False)
class Waiter:
    rank: int  # the key's class (app.core.keys.class_rank): a better class is served first
    project: str  # the key's
    user: str
    alias: str
    seq: int  # arrival
    future: asyncio.Future[Upstream]


class _Heap(Generic[T]):
    """Items by a key that changes: the new key is pushed, and an entry whose key is no longer its item's is dropped
    when it comes to the top. Rebuilt when stale entries outnumber the live ones, so it stays O(live)."""

    def __init__(self) -> None:
        self.keys: dict[T, Any] = {}
        self._heap: list[tuple[Any, int, T]] = []
        self._pushed = itertools.count()  # a tie never compares two items (the keys below are unique anyway)

    def put(self, item: T, key: Any) -> None:
        if item in self.keys and self.keys[item] == key:
            return
        self.keys[item] = key
        heapq.heappush(self._heap, (key, next(self._pushed), item))
        if len(self._heap) > 2 * len(self.keys) + 16:
            self._heap = [(k, next(self._pushed), i) for i, k in self.keys.items()]
            heapq.heapify(self._heap)

    def drop(self, item: T) -> None:
        self.keys.pop(item, None)

    def first(self) -> tuple[Any, T] | None:
        """(key, item) of the least key, or None when empty."""
        while self._heap:
            key, _, item = self._heap[0]
            if item in self.keys and self.keys[item] == key:
                return key, item
            heapq.heappop(self._heap)
        return None


class WaitQueue:
    """The waiting requests of every model, each model's apart: alias -> class -> projects (by standing and their
    first member's key) -> members (by turn and their first request's arrival) -> the member's requests, first come.

    A member's turn on a model is when a request of theirs last got one of its slots (a count, not a time; never:
    -1, first); it is forgotten when they have nothing in flight (gone), so a member who comes back comes as new."""

    def __init__(self, usage: Usage) -> None:
        self.usage = usage
        self.turns: dict[str, dict[str, int]] = {}  # user -> alias -> their turn on it
        self._turn = itertools.count()
        self._seq = itertools.count()
        self._classes: dict[str, dict[int, _Heap[str]]] = {}  # alias -> rank -> its projects
        self._members: dict[tuple[str, int, str], _Heap[str]] = {}  # (alias, rank, project) -> its members
        self._lines: dict[tuple[str, int, str, str], deque[Waiter]] = {}  # ... + user -> their requests in order
        self._where: dict[tuple[str, str], set[tuple[int, str]]] = {}  # (alias, user) -> their (rank, project)s
        self._sizes: dict[str, int] = {}  # alias -> requests waiting

    def __len__(self) -> int:
        return sum(self._sizes.values())

    def waiting(self, alias: str) -> bool:
        return alias in self._sizes

    def aliases(self) -> list[str]:
        return list(self._sizes)

    def push(self, rank: int, project: str, user: str, alias: str, future: asyncio.Future[Upstream]) -> Waiter:
        waiter = Waiter(rank, project, user, alias, next(self._seq), future)
        line = self._lines.setdefault((alias, rank, project, user), deque())
        line.append(waiter)
        self._sizes[alias] = self._sizes.get(alias, 0) + 1
        if len(line) == 1:
            self._where.setdefault((alias, user), set()).add((rank, project))
            self._rekey(alias, rank, project, user)
        return waiter

    def pop(self, alias: str) -> Waiter | None:
        """The request to hand the model's next free slot to, out of the queue; None when none waits."""
        for rank, projects in sorted(self._classes.get(alias, {}).items()):
            first = projects.first()
            if first is None:
                continue
            project = first[1]
            member = self._members[(alias, rank, project)].first()
            assert member is not None  # a project is listed while a member of it waits
            user = member[1]
            waiter = self._lines[(alias, rank, project, user)][0]
            self.remove(waiter)
            return waiter
        return None

    def remove(self, waiter: Waiter) -> bool:
        """Take a request out (handed a slot, or given up); False when it is not waiting."""
        place = (waiter.alias, waiter.rank, waiter.project, waiter.user)
        line = self._lines.get(place)
        if line is None or waiter not in line:
            return False
        line.remove(waiter)  # at most the member's cap long: [gateway] max_concurrent_per_user
        self._sizes[waiter.alias] -= 1
        if not self._sizes[waiter.alias]:
            del self._sizes[waiter.alias]
        if not line:
            del self._lines[place]
            where = self._where[(waiter.alias, waiter.user)]
            where.discard((waiter.rank, waiter.project))
            if not where:
                del self._where[(waiter.alias, waiter.user)]
        self._rekey(*place)
        return True

    def served(self, user: str, alias: str) -> None:
        """A request of `user` got a slot of `alias` now: their requests waiting for it go behind the other members'."""
        self.turns.setdefault(user, {})[alias] = next(self._turn)
        for rank, project in self._where.get((alias, user), ()):
            self._rekey(alias, rank, project, user)

    def gone(self, user: str) -> None:
        """`user` has nothing in flight or waiting: their turns are forgotten (and the map stays small)."""
        self.turns.pop(user, None)

    def charged(self, project: str, tokens: float, now: float) -> None:
        """A request of `project` finished with `tokens`: its waiting requests move by its new standing."""
        self.usage.add(project, tokens, now)
        for alias, classes in self._classes.items():
            for rank, projects in classes.items():
                if project in projects.keys:
                    self._rekey_project(alias, rank, project)

    def _rekey(self, alias: str, rank: int, project: str, user: str) -> None:
        """The member's key after their line changed (or their turn): then their project's."""
        members = self._members.setdefault((alias, rank, project), _Heap())
        line = self._lines.get((alias, rank, project, user))
        if line:
            members.put(user, (self.turns.get(user, {}).get(alias, -1), line[0].seq))
        else:
            members.drop(user)
        self._rekey_project(alias, rank, project)

    def _rekey_project(self, alias: str, rank: int, project: str) -> None:
        classes = self._classes.setdefault(alias, {})
        projects = classes.setdefault(rank, _Heap())
        first = self._members[(alias, rank, project)].first()
        if first is not None:
            projects.put(project, (self.usage.standing(project), first[0]))
            return
        del self._members[(alias, rank, project)]
        projects.drop(project)
        if not projects.keys:
            del classes[rank]
            if not classes:
                del self._classes[alias]
