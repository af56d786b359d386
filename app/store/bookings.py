"""Booking rows: the SQL, and nothing else. Rules live in app.service.rules.bookings."""

from __future__ import annotations

import json
import sqlite3
from bisect import bisect_left, insort
from itertools import groupby
from operator import itemgetter
from typing import Any, Iterable, Iterator

from app.gpu.model import CardReading
from app.model import Booking
from app.store.db import MalformedRow, inserted_id, need, need_json_object, report_malformed


# LEFT JOINs, so that a booking whose card rows a hand edit broke is reported rather than silently dropped.
_SELECT = """
SELECT b.id, b."user", b.uid, b.starts_at, b.ends_at, b.class, b.note, b.status, b.request, b.created_at,
       b.requested_at, b.queued, b.series_id, b.notice, {cards}, max(c.host), b.project
FROM bookings AS b
LEFT JOIN booking_cards AS bc ON bc.booking_id = b.id
LEFT JOIN cards AS c ON c.uuid = bc.card_uuid
"""
# A booking's cards as lines of "idx uuid", in each store's words.
_SELECTS = {
    "sqlite": _SELECT.format(cards="group_concat(coalesce(c.idx, '?') || ' ' || bc.card_uuid, char(10))"),
    "postgresql": _SELECT.format(cards="string_agg(coalesce(c.idx::text, '?') || ' ' || bc.card_uuid, chr(10))"),
}


def _select(conn: sqlite3.Connection) -> str:
    return _SELECTS[getattr(conn, "dialect", "sqlite")]


# An on-demand booking's request (app.model.Booking.on_demand) as `insert` writes it (json.dumps): no other key of a
# request is named so (app.core.request.FIELDS), and no string value holds an unescaped quote.
_ON_DEMAND_LIKE = '%"on\\_demand": %'


def _which(on_demand: bool | None) -> tuple[str, tuple[str, ...]]:
    """The condition (and its argument) that keeps the on-demand bookings (True), the others (False) or all (None)."""
    if on_demand is None:
        return "", ()
    if on_demand:
        return " AND b.request LIKE ? ESCAPE '\\'", (_ON_DEMAND_LIKE,)
    return " AND (b.request IS NULL OR b.request NOT LIKE ? ESCAPE '\\')", (_ON_DEMAND_LIKE,)

_STATUSES = ("booked", "cancelled")


def _booking(row, here: str = "") -> Booking:
    """Decode one row of _SELECT; raises MalformedRow saying what a hand edit broke. `here`: the host of cards
    recorded before the fleet (host ''), which are the reading service's own until its agent claims them."""
    try:
        return _decode(row, here)
    except MalformedRow:
        raise
    except (ValueError, TypeError, AttributeError) as error:
        raise MalformedRow(str(error)) from None


def _decode(row, here: str = "") -> Booking:
    (id_, user, uid, start, end, klass, note, status, request, created_at, requested_at, queued, series_id, notice, cards,
     host, project) = row
    for value, kind, column in ((user, str, "user"), (uid, int, "uid"), (start, int, "starts_at"),
                                (end, int, "ends_at"), (klass, str, "class"), (note, str, "note"),
                                (status, str, "status"), (created_at, int, "created_at"), (project, str, "project")):
        need(value, kind, column)
    if status not in _STATUSES:
        raise MalformedRow(f"status is {ascii(status)[:40]}, not booked or cancelled")
    if requested_at is not None:
        need(requested_at, int, "requested_at")
    if queued not in (None, "time", "cards"):
        raise MalformedRow(f"queued is {ascii(queued)[:40]}, not time, cards or null")
    if end <= start:
        raise MalformedRow(f"it ends ({end}) before it starts ({start})")
    if cards is None:
        raise MalformedRow("it has no cards")
    pairs = []
    for line in cards.split("\n"):
        idx, uuid = line.split(" ", 1)
        if idx == "?":
            raise MalformedRow(f"its card {ascii(uuid)[:60]} is not in the cards table")
        pairs.append((int(idx), uuid))
    pairs.sort()
    if request:
        request = need_json_object(request, "request")
    return Booking(
        id=id_, user=user, uid=uid, start=start, end=end, klass=klass, note=note, status=status,
        request=request or None, created_at=created_at, requested_at=requested_at if requested_at is not None else start,
        queued=queued, series_id=series_id, notice=notice if isinstance(notice, str) else None,
        cards=tuple(p[0] for p in pairs), card_uuids=tuple(p[1] for p in pairs), host=host or here, project=project,
    )


def _decoded(conn: sqlite3.Connection, rows: Iterable) -> list[Booking]:
    """The rows that decode; each one that does not is reported once (report_malformed) and skipped."""
    found, here = [], getattr(conn, "fleet_host", "")
    for row in rows:
        try:
            found.append(_booking(row, here))
        except MalformedRow as error:
            report_malformed(conn, "booking", row[0], error)
    return found


def get(conn: sqlite3.Connection, booking_id: int) -> Booking | None:
    """The booking, or None when there is none or its row is malformed (which is reported). A live one the calendar in
    memory keeps comes from there (a booking just made is read once, for both); on PostgreSQL one the write that just
    committed made, from the read sent with its insert (`insert`)."""
    if (calendar := getattr(conn, "calendar", None)) is not None and (found := calendar.get(booking_id)) is not None:
        return found
    made = getattr(conn, "made", None)
    if made and (cursor := made.pop(booking_id, None)) is not None and cursor.sent:
        row = cursor.fetchone()
        found = _decoded(conn, [row]) if row else []
        return found[0] if found else None
    return _get(conn, booking_id)


def _get(conn: sqlite3.Connection, booking_id: int) -> Booking | None:
    row = conn.execute(_select(conn) + " WHERE b.id = ? GROUP BY b.id", (booking_id,)).fetchone()
    found = _decoded(conn, [row]) if row else []
    return found[0] if found else None


def live_between(conn: sqlite3.Connection, start: int, end: int, *, user: str | None = None,
                 on_demand: bool | None = None) -> list[Booking]:
    """Live (not cancelled) bookings that overlap [start, end), oldest start first. `on_demand`: only the on-demand
    ones (True), only the others (False), or all (None)."""
    if (calendar := _calendar(conn, start, end, user=user, on_demand=on_demand)) is not None:
        return calendar.between(start, end, user, on_demand)
    where, extra = _which(on_demand)
    sql = _select(conn) + " WHERE b.status = 'booked' AND b.ends_at > ? AND b.starts_at < ?" + where
    args: list[Any] = [start, end, *extra]
    if user is not None:
        sql += " AND b.user = ?"
        args.append(user)
    return _decoded(conn, conn.execute(sql + " GROUP BY b.id ORDER BY b.starts_at, b.id", args))


def listing(
    conn: sqlite3.Connection, *, start: int | None, end: int | None, user: str | None, include_cancelled: bool
) -> list[Booking]:
    clauses: list[str] = []
    args: list[int | str] = []
    if not include_cancelled:
        clauses.append("b.status = 'booked'")
    if start is not None:
        clauses.append("b.ends_at > ?")
        args.append(start)
    if end is not None:
        clauses.append("b.starts_at < ?")
        args.append(end)
    if user is not None:
        clauses.append("b.user = ?")
        args.append(user)
    where = " WHERE " + " AND ".join(clauses) if clauses else ""
    return _decoded(conn, conn.execute(_select(conn) + where + " GROUP BY b.id ORDER BY b.starts_at, b.id", args))


def busy_by_card(
    conn: sqlite3.Connection, after: int, before: int | None = None, excluding: int | None = None,
    on_demand: bool | None = None,
) -> dict[str, list[tuple[int, int]]]:
    """Live intervals per card UUID that overlap [after, before), sorted; served by the bookings_live_by_end index.
    `on_demand`: only the on-demand bookings' (True), only the others' (False), or all (None).

    Rows carry the card's integer rowid rather than its UUID: a full calendar is thousands of rows,
    and integers cost nothing to decode.
    """
    if (calendar := _calendar(conn, after)) is not None:
        return calendar.busy(after, 2**62 if before is None else before, excluding, on_demand)
    uuids = dict(conn.execute("SELECT rowid, uuid FROM cards"))
    where, extra = _which(on_demand)
    rows = conn.execute(
        "SELECT c.rowid, b.starts_at, b.ends_at FROM bookings AS b"
        " JOIN booking_cards AS bc ON bc.booking_id = b.id JOIN cards AS c ON c.uuid = bc.card_uuid"
        " WHERE b.status = 'booked' AND b.ends_at > ? AND b.starts_at < ? AND b.id IS DISTINCT FROM ?" + where +
        " ORDER BY c.rowid, b.starts_at",
        (after, 2**62 if before is None else before, excluding, *extra),
    )
    return {uuids[card]: [(start, end) for _, start, end in spans] for card, spans in groupby(rows, itemgetter(0))}


def first_conflict(
    conn: sqlite3.Connection, uuids: Iterable[str], start: int, end: int, excluding: int | None = None,
    on_demand: bool | None = None,
) -> Booking | None:
    """The live booking on any of `uuids` that overlaps [start, end) and ends first, or None. `on_demand`: only an
    on-demand booking (True), only another (False), or any (None).

    A malformed booking is reported and passed over; the schema's overlap triggers still refuse a
    booking that would overlap it.
    """
    return next(_overlapping(conn, uuids, start, end, excluding, on_demand), None)


def overlapping(
    conn: sqlite3.Connection, uuids: Iterable[str], start: int, end: int, excluding: int | None = None,
    on_demand: bool | None = None,
) -> list[Booking]:
    """The live bookings on any of `uuids` that overlap [start, end), the first to end first; `on_demand` as in
    `first_conflict`."""
    return list(_overlapping(conn, uuids, start, end, excluding, on_demand))


def _overlapping(
    conn: sqlite3.Connection, uuids: Iterable[str], start: int, end: int, excluding: int | None,
    on_demand: bool | None,
) -> Iterator[Booking]:
    uuids = list(uuids)
    if (calendar := _calendar(conn, start, end, uuids=uuids, on_demand=on_demand)) is not None:
        yield from calendar.overlapping(uuids, start, end, excluding, on_demand)
        return
    if not uuids:  # no card, no conflict (and PostgreSQL has no empty IN ())
        return
    marks = ",".join("?" * len(uuids))
    where, extra = _which(on_demand)
    ids = [row[0] for row in conn.execute(
        f"SELECT DISTINCT b.id, b.ends_at FROM bookings AS b JOIN booking_cards AS bc ON bc.booking_id = b.id"
        f" WHERE b.status = 'booked' AND b.ends_at > ? AND b.starts_at < ? AND b.id IS DISTINCT FROM ?"
        f" AND bc.card_uuid IN ({marks}){where} ORDER BY b.ends_at, b.id",
        [start, end, excluding, *uuids, *extra],
    )]
    for booking_id in ids:  # one at a time: the first conflict is usually all that is asked
        if (found := get(conn, booking_id)) is not None:
            yield found


def insert(
    conn: sqlite3.Connection, *, user: str, uid: int, uuids: Iterable[str], start: int, end: int, klass: str,
    note: str, request: dict | None, now: int, created_by: int, requested_at: int | None = None,
    queued: str | None = None, series_id: int | None = None, project: str = "",
) -> int:
    values = (user, uid, start, end, klass, note, json.dumps(request) if request else None, now, created_by,
              start if requested_at is None else requested_at, queued, series_id, project)
    if (booking_id := getattr(conn, "reserved_booking", None)) is not None:
        return _insert_deferred(conn, booking_id, values, list(uuids))
    cursor = conn.execute(
        'INSERT INTO bookings ("user", uid, starts_at, ends_at, class, note, request, created_at, created_by,'
        " requested_at, queued, series_id, project) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        values,
    )
    booking_id = inserted_id(cursor)
    conn.executemany(
        "INSERT INTO booking_cards (card_uuid, booking_id) VALUES (?, ?)", [(u, booking_id) for u in uuids]
    )
    _touched(conn, booking_id)
    return booking_id


def _insert_deferred(conn, booking_id: int, values: tuple, uuids: list[str]) -> int:
    """On PostgreSQL, with the id the write took with its locks (app.store.db.write's `new_booking`): the booking and
    its cards in one statement, and the booking read back after it, both sent with the write's next round trip (its
    COMMIT: PgConnection.defer); `get` answers from that read."""
    conn.reserved_booking = None  # one booking's
    conn.defer(
        'WITH b AS (INSERT INTO bookings (id, "user", uid, starts_at, ends_at, class, note, request, created_at,'
        " created_by, requested_at, queued, series_id, project) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " RETURNING id) INSERT INTO booking_cards (card_uuid, booking_id) SELECT u, b.id FROM b, unnest(?::text[]) AS u",
        (booking_id, *values, uuids))
    _touched(conn, booking_id)
    conn.made[booking_id] = conn.defer(_select(conn) + " WHERE b.id = ? GROUP BY b.id", (booking_id,))
    return booking_id


def set_times(conn: sqlite3.Connection, booking_id: int, start: int, end: int) -> None:
    conn.execute("UPDATE bookings SET starts_at = ?, ends_at = ? WHERE id = ?", (start, end, booking_id))
    _touched(conn, booking_id)


def set_notice(conn: sqlite3.Connection, booking_id: int, notice: str) -> None:
    conn.execute("UPDATE bookings SET notice = ? WHERE id = ?", (notice, booking_id))
    _touched(conn, booking_id)


def queued(conn: sqlite3.Connection, now: int) -> list[Booking]:
    """Live bookings that asked to move earlier and have not started, served by the bookings_queued index."""
    return _decoded(conn, conn.execute(
        _select(conn) + " WHERE b.status = 'booked' AND b.queued IS NOT NULL AND b.starts_at > ? GROUP BY b.id"
        " ORDER BY b.starts_at, b.id", (now,)))


def card_spans(conn: sqlite3.Connection, start: int, end: int) -> list[tuple[str, int, int, int]]:
    """(project, start, end, number of cards) of each live booking that overlaps [start, end): what fair share weighs
    (app.core.fairshare), read without decoding whole bookings (8 times faster over 10,000). A row whose fields are
    not of their kinds is left out here; the readers of whole bookings report it."""
    found = conn.execute(
        "SELECT b.project, b.starts_at, b.ends_at, COUNT(*) FROM bookings b JOIN booking_cards bc ON bc.booking_id = b.id"
        " WHERE b.status = 'booked' AND b.ends_at > ? AND b.starts_at < ?"
        " GROUP BY b.id, b.project, b.starts_at, b.ends_at", (start, end))
    return [(project, first, last, int(cards)) for project, first, last, cards in found
            if isinstance(project, str) and type(first) is int and type(last) is int and first < last]


def set_queued(conn: sqlite3.Connection, booking_id: int, queued: str | None) -> None:
    conn.execute("UPDATE bookings SET queued = ? WHERE id = ?", (queued, booking_id))
    _touched(conn, booking_id)


def cut_end(conn: sqlite3.Connection, booking_id: int, end: int) -> None:
    """End the booking at `end` unless it ends sooner already: two writers cutting it at once (PostgreSQL, each on its
    own cards' locks) leave the earlier end, whichever commits last."""
    conn.execute("UPDATE bookings SET ends_at = CASE WHEN ends_at > ? THEN ? ELSE ends_at END WHERE id = ?",
                 (end, end, booking_id))
    _touched(conn, booking_id)


def set_cancelled(conn: sqlite3.Connection, booking_id: int) -> None:
    conn.execute("UPDATE bookings SET status = 'cancelled' WHERE id = ?", (booking_id,))
    _touched(conn, booking_id)


def set_owner(conn: sqlite3.Connection, booking_id: int, user: str, uid: int) -> None:
    conn.execute('UPDATE bookings SET "user" = ?, uid = ? WHERE id = ?', (user, uid, booking_id))
    _touched(conn, booking_id)


def set_cards(conn: sqlite3.Connection, booking_id: int, uuids: Iterable[str]) -> None:
    conn.execute("DELETE FROM booking_cards WHERE booking_id = ?", (booking_id,))
    conn.executemany(
        "INSERT INTO booking_cards (card_uuid, booking_id) VALUES (?, ?)", [(u, booking_id) for u in uuids]
    )
    _touched(conn, booking_id)


def sync_cards(conn: sqlite3.Connection, cards: Iterable[CardReading], now: int, host: str = "") -> None:
    """Record the cards NVML reports on `host`, keyed by UUID; the index can change after a reboot.

    Reads first and writes only what changed, so the usual booking adds no page to the WAL. On PostgreSQL a read that
    found, with what it wrote, is kept (PgConnection.cards_seen) while the cards stay as it found them: the usual
    booking reads nothing either. A rollback forgets it.
    """
    cards = list(cards)
    seen = getattr(conn, "cards_seen", None)
    if seen is not None and all(seen.get(c.uuid) == (c.index, c.name, host) for c in cards):
        return
    known = {uuid: (idx, name, h) for uuid, idx, name, h in conn.execute("SELECT uuid, idx, name, host FROM cards")}
    # By UUID: two writers that both record the same cards (PostgreSQL, on their cards' locks) lock the rows in one
    # order, so one waits for the other rather than deadlocking.
    changed = sorted((c.uuid, c.index, c.name, now, host) for c in cards
                     if known.get(c.uuid, (None, None, None)) != (c.index, c.name, host))
    conn.executemany(
        "INSERT INTO cards (uuid, idx, name, seen_at, host) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT (uuid) DO UPDATE SET idx = excluded.idx, name = coalesce(excluded.name, cards.name),"
        " seen_at = excluded.seen_at, host = excluded.host",
        changed,
    )
    if changed and (calendar := getattr(conn, "calendar", None)) is not None:
        calendar.stale = True  # a booking names its cards by index: read them all again
    if hasattr(conn, "cards_seen"):  # PostgreSQL's: the rows as they stand now (a rollback forgets them)
        conn.cards_seen = {**known, **{uuid: (idx, name, h) for uuid, idx, name, _, h in changed
                                       if name is not None}}  # a None keeps the name it had: not known here


def any_live_server(conn: sqlite3.Connection) -> bool:
    """Whether any server is starting, ready or stopping (as live_server_ids counts them)."""
    return conn.execute("SELECT 1 FROM servers WHERE state IN ('starting', 'ready', 'stopping') LIMIT 1").fetchone() \
        is not None


def live_server_ids(conn: sqlite3.Connection, booking_id: int) -> list[int]:
    """The booking's servers that are starting, ready or stopping (app.llama.rows.LIVE_STATES), by id."""
    return [r[0] for r in conn.execute(
        "SELECT id FROM servers WHERE booking_id = ? AND state IN ('starting', 'ready', 'stopping') ORDER BY id",
        (booking_id,),
    )]


# -- the calendar in memory -------------------------------------------------------------------------------


class Calendar:
    """The live bookings of one connection's database, in memory: each card's spans sorted (bisect), each user's
    bookings by start. The service keeps one on each of its connections (`keep_calendar`), so that a search for a
    slot, which asks at many starts, reads no SQL.

    It stays true to the file: every change this module makes marks its booking, read again before the next
    answer (and once more when the transaction ends, so a rollback is seen); a commit by any other connection
    (another process on a file-mode database) changes PRAGMA data_version, and then everything is read again.
    Bookings that ended before `since` are not kept: an older question goes to SQL. The store stays the judge at
    commit (BEGIN IMMEDIATE, and the overlap triggers)."""

    def __init__(self, conn: sqlite3.Connection, since: int) -> None:
        self.conn, self.since = conn, since
        self.stale = True
        self.version: int | None = None
        self.pending: set[int] = set()  # changed, not read again yet
        self.in_transaction: set[int] = set()  # changed in the open transaction: read again when it ends
        self.recent: set[int] = set()  # changed since the transaction's last savepoint (mark): what a ROLLBACK TO undoes
        self.loaded_since_mark = False
        self.bookings: dict[int, Booking] = {}
        self.cards: dict[str, tuple[list[tuple[int, int]], list[int]]] = {}  # uuid -> spans (start, end), sorted, and their ids
        self.users: dict[str, list[tuple[int, int]]] = {}  # user -> (start, id), sorted
        self.on_demand: set[int] = set()  # the on-demand bookings' ids (app.model.Booking.on_demand)
        self.longest = 0  # the longest booking's seconds: how far back a start may be and still overlap
        self.loaded_in_transaction = False  # then read all again when it ends: it may be rolled back

    # -- keeping it true ---------------------------------------------------------------------------------

    def _fresh(self) -> None:
        conn = self.conn
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if self.stale or version != self.version or (self.loaded_in_transaction and not conn.in_transaction):
            self._load()
            self.version = version
        elif self.pending or (self.in_transaction and not conn.in_transaction):
            ids = self.pending | (self.in_transaction if not conn.in_transaction else set())
            for booking_id in ids:
                self._drop(booking_id)
                found = _get(conn, booking_id)
                if found is not None:
                    self._add(found)
            if conn.in_transaction:
                self.in_transaction |= self.pending
            else:
                self.in_transaction.clear()
            self.pending.clear()

    def ended(self, committed: bool) -> None:
        """The write transaction ended (app.store.db.write). Committed, what it changed and was read again stands;
        rolled back, that is read again. Either way the next transaction starts with nothing of its own, even when
        every read of the calendar is made inside one (the agent's, which plans under the write lock)."""
        if not committed:
            self.pending |= self.in_transaction | self.recent
            self.stale |= self.loaded_in_transaction
        self.in_transaction.clear()
        self.recent.clear()
        self.loaded_in_transaction = self.loaded_since_mark = False

    def mark(self) -> None:
        """A SAVEPOINT (app.store.db): a ROLLBACK TO it undoes only the changes from here on."""
        self.recent = set()
        self.loaded_since_mark = False

    def rolled_back(self) -> None:
        """A ROLLBACK TO the transaction's last savepoint: what changed since it is read again (not all the
        transaction changed: a group commit's earlier bookings stand)."""
        self.pending |= self.recent
        self.stale |= self.loaded_since_mark

    def _load(self) -> None:
        self.bookings, self.cards, self.users, self.longest = {}, {}, {}, 0
        self.on_demand = set()
        self.pending.clear()
        self.in_transaction.clear()
        self.stale = False
        self.loaded_in_transaction = self.loaded_since_mark = self.conn.in_transaction
        for booking in _decoded(self.conn, self.conn.execute(
                _select(self.conn) + " WHERE b.status = 'booked' AND b.ends_at > ? GROUP BY b.id", (self.since,))):
            self._add(booking)

    def _add(self, booking: Booking) -> None:
        if booking.status != "booked" or booking.end <= self.since:
            return
        self.bookings[booking.id] = booking
        for uuid in booking.card_uuids:
            spans, ids = self.cards.setdefault(uuid, ([], []))
            i = bisect_left(spans, (booking.start, booking.end))
            spans.insert(i, (booking.start, booking.end))
            ids.insert(i, booking.id)
        insort(self.users.setdefault(booking.user, []), (booking.start, booking.id))
        if booking.on_demand:
            self.on_demand.add(booking.id)
        self.longest = max(self.longest, booking.end - booking.start)

    def _drop(self, booking_id: int) -> None:
        booking = self.bookings.pop(booking_id, None)
        if booking is None:
            return
        for uuid in booking.card_uuids:
            spans, ids = self.cards[uuid]
            i = ids.index(booking.id)
            del spans[i], ids[i]
        self.users[booking.user].remove((booking.start, booking.id))
        self.on_demand.discard(booking_id)

    # -- the answers (as the SQL's) ------------------------------------------------------------------------

    def covers(self, after: int, before: int | None, uuids: list[str] | None, user: str | None,
               on_demand: bool | None = None) -> bool:
        """Whether it answers a question about the bookings in [after, before) (on `uuids`, of `user`): all it
        keeps, from `since` on."""
        return after >= self.since

    def _range(self, uuid: str, start: int, end: int) -> tuple[list, list, int, int]:
        """The card's spans and ids, and the range [i, j) of them that overlap [start, end). On one card they do
        not overlap, so only the one just before the first start at or after `start` can reach into it."""
        spans, ids = self.cards.get(uuid) or ([], [])
        i, j = bisect_left(spans, (start,)), bisect_left(spans, (end,))
        while i > 0 and spans[i - 1][1] > start:
            i -= 1
        return spans, ids, i, j

    def _spans(self, uuid: str, start: int, end: int):
        spans, ids, i, j = self._range(uuid, start, end)
        for k in range(i, j):
            if spans[k][1] > start:
                yield spans[k][0], spans[k][1], ids[k]

    def get(self, booking_id: int) -> Booking | None:
        """The booking if it is live and kept here; None: ask SQL."""
        self._fresh()
        return self.bookings.get(booking_id)

    def _wanted(self, booking_id: int, on_demand: bool | None, excluding: int | None) -> bool:
        """Whether an answer for `on_demand` (as busy_by_card's) and `excluding` takes the booking."""
        if booking_id == excluding:
            return False
        return on_demand is None or (booking_id in self.on_demand) == on_demand

    def busy(self, after: int, before: int, excluding: int | None,
             on_demand: bool | None = None) -> dict[str, list[tuple[int, int]]]:
        self._fresh()
        if on_demand and not self.on_demand:
            return {}
        every = on_demand is None or not self.on_demand  # no booking to leave out but `excluding`
        found = {}
        for uuid in self.cards:
            spans, ids, i, j = self._range(uuid, after, before)
            if i >= j:
                continue
            if every and excluding not in ids[i:j]:
                found[uuid] = spans[i:j]
            elif kept := [spans[k] for k in range(i, j) if self._wanted(ids[k], on_demand, excluding)]:
                found[uuid] = kept
        return found

    def between(self, start: int, end: int, user: str | None, on_demand: bool | None = None) -> list[Booking]:
        self._fresh()
        if user is None:
            ids = {booking_id for uuid in self.cards for _, _, booking_id in self._spans(uuid, start, end)}
            found = [self.bookings[i] for i in ids]
        else:
            mine = self.users.get(user) or ()
            found = []
            for i in range(bisect_left(mine, (start - self.longest,)), bisect_left(mine, (end,))):
                booking = self.bookings[mine[i][1]]
                if booking.end > start:
                    found.append(booking)
        if on_demand is not None:
            found = [b for b in found if self._wanted(b.id, on_demand, None)]
        found.sort(key=lambda b: (b.start, b.id))
        return found

    def overlapping(self, uuids: list[str], start: int, end: int, excluding: int | None,
                    on_demand: bool | None = None) -> list[Booking]:
        self._fresh()
        if on_demand and not self.on_demand:
            return []
        found = {(e, booking_id) for uuid in uuids for _, e, booking_id in self._spans(uuid, start, end)
                 if self._wanted(booking_id, on_demand, excluding)}
        return [self.bookings[booking_id] for _, booking_id in sorted(found)]


def keep_calendar(conn: sqlite3.Connection, since: int) -> Calendar:
    """Keep the live bookings that end after `since` in memory on this connection (app.store.db's), for its reads."""
    conn.calendar = calendar = Calendar(conn, since)  # type: ignore[attr-defined]
    return calendar


def rolled_back(conn: sqlite3.Connection) -> None:
    """Say that a ROLLBACK TO a savepoint undid this transaction's changes so far (the calendar reads them again; on
    PostgreSQL the cards seen and the bookings read back are forgotten)."""
    calendar = getattr(conn, "calendar", None)
    if calendar is not None:
        calendar.rolled_back()
    if hasattr(conn, "cards_seen"):
        conn.cards_seen, conn.made = None, {}  # type: ignore[attr-defined]


def _calendar(conn: sqlite3.Connection, after: int, before: int | None = None, *, uuids: list[str] | None = None,
              user: str | None = None, on_demand: bool | None = None) -> Calendar | None:
    """The connection's calendar if it answers a question about the bookings in [after, before) (on `uuids`, or of
    `user`, when the question is only about those; `on_demand` as busy_by_card's)."""
    calendar = getattr(conn, "calendar", None)
    return calendar if calendar is not None and calendar.covers(after, before, uuids, user, on_demand) else None


def prefetch_sql(conn, uuids: tuple[str, ...], user: str, reads: tuple[int, int]) -> str:
    """The read of what Prefetched keeps, without parameters (it goes in app.store.db.write's opening script)."""
    cards = ", ".join(conn.quote(uuid) for uuid in uuids)
    return (_select(conn) + f" WHERE b.status = 'booked' AND b.ends_at > {int(reads[0])}"
            f" AND b.starts_at < {int(reads[1])} AND (b.\"user\" ="
            f" {conn.quote(user)} OR b.id IN (SELECT booking_id FROM booking_cards WHERE card_uuid IN ({cards})))"
            " GROUP BY b.id")


class Prefetched(Calendar):
    """On PostgreSQL, within a write on named cards (app.store.db.write's `reads`): the live bookings on its cards and
    of its user that overlap its span, read with its locks. It answers only questions about those (`covers`); its
    own changes are read again, as the calendar's are.

    Under those locks no other writer changes them, but for an on-demand booking that also holds a card outside them:
    a booking on that card cuts it (app.service.rules.bookings `_make_way`) under that card's lock alone. While it
    holds one, a question that may take on-demand bookings in (and a read of one by id) goes to SQL."""

    def __init__(self, conn: sqlite3.Connection, reads: tuple[int, int], uuids: tuple[str, ...], user: str,
                 found: list) -> None:
        super().__init__(conn, reads[0])
        self.until = reads[1]
        self.scope, self.user = frozenset(uuids), user
        self.stale = False
        for booking in _decoded(conn, found):
            self._add(booking)
        self.unsure = {b.id for b in self.bookings.values() if b.on_demand and not self.scope.issuperset(b.card_uuids)}

    def covers(self, after: int, before: int | None, uuids: list[str] | None, user: str | None,
               on_demand: bool | None = None) -> bool:
        if self.unsure and on_demand is not False or before is None or not self.since <= after < before <= self.until:
            return False
        return user == self.user if uuids is None else self.scope.issuperset(uuids)

    def get(self, booking_id: int) -> Booking | None:
        return None if booking_id in self.unsure else super().get(booking_id)

    def _fresh(self) -> None:
        for booking_id in self.pending:
            self._drop(booking_id)
            if (found := _get(self.conn, booking_id)) is not None:
                self._add(found)
        self.pending.clear()


def _touched(conn: sqlite3.Connection, booking_id: int) -> None:
    if made := getattr(conn, "made", None):
        made.pop(booking_id, None)  # read back as it was inserted: changed since
    calendar = getattr(conn, "calendar", None)
    if calendar is not None:
        calendar.pending.add(booking_id)
        calendar.recent.add(booking_id)
