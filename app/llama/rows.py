"""Server rows: the SQL for the `servers` table (schema v2; v4 added `estimate` and `measured`), and the shapes of
its JSON columns. Rules live in app.llama.service."""

from __future__ import annotations

import json
import signal
import socket
import sqlite3
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from app.store.db import MalformedRow, need, report_malformed

STARTING, READY, STOPPING, STOPPED, CRASHED, FAILED = "starting", "ready", "stopping", "stopped", "crashed", "failed"
LIVE_STATES = (STARTING, READY, STOPPING)
FINAL_STATES = (STOPPED, CRASHED, FAILED)


@dataclass(frozen=True, slots=True)
class Server:
    id: int
    booking_id: int
    user: str
    uid: int
    cards: tuple[int, ...]  # in CUDA_VISIBLE_DEVICES order (topology order)
    card_uuids: tuple[str, ...]
    model: str
    alias: str | None
    host: str
    port: int
    ctx: int | None
    parallel: int | None
    split_mode: str | None
    metrics: bool
    cmdline: tuple[str, ...]
    log_path: str
    state: str
    pid: int | None = None
    pid_started: float | None = None
    pgid: int | None = None
    supervisor_pid: int | None = None
    supervisor_started: float | None = None
    supervisor_cmdline: tuple[str, ...] = ()
    created_at: int = 0
    ready_at: int | None = None
    ended_at: int | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    reason: str | None = None
    log_tail: tuple[str, ...] = field(default=())
    # board's estimate the start was checked against (check_estimate), and what llama.cpp logged at load
    # (check_measured: app.llama.memory.Measured.to_json); None when unknown.
    estimate: dict | None = None
    measured: dict | None = None
    # the server's own key (--api-key-file): for its holder, admins and the gateway; never in a listing
    api_key: str | None = None

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def url(self) -> str:
        host = self.host
        if host in ("0.0.0.0", ""):
            host = socket.gethostname()
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def measured_memory(self):
        """The measured figures as app.llama.memory.Measured, or None when none were recorded."""
        if not self.measured:
            return None
        from app.llama.memory import Measured  # start-up: the log's memory parser loads only to read figures

        try:
            return Measured.from_json(self.measured)
        except (ArithmeticError, RecursionError):
            return None

    @property
    def estimate_per_card(self) -> list[int] | None:
        """board's estimate in MiB for each card, in `cards` order, or None when there is none."""
        figures = (self.estimate or {}).get("per_card_mib")
        if not isinstance(figures, list) or not figures or not all(_mib(f) for f in figures):
            return None
        return list(figures)

    @property
    def exit_text(self) -> str | None:
        """'exit code 1', 'killed by signal 9 (SIGKILL)', or None while it runs or when unknown."""
        if self.exit_signal is not None:
            try:
                name = signal.Signals(self.exit_signal).name
            except ValueError:
                name = "?"
            return f"killed by signal {self.exit_signal} ({name})"
        if self.exit_code is not None:
            return f"exit code {self.exit_code}"
        return None


_COLUMNS = (
    "id, booking_id, \"user\", uid, cards, card_uuids, model, alias, host, port, ctx, parallel, split_mode, metrics,"
    " cmdline, log_path, state, pid, pid_started, pgid, supervisor_pid, supervisor_started, supervisor_cmdline,"
    " created_at, ready_at, ended_at, exit_code, exit_signal, reason, log_tail, estimate, measured, api_key"
)


def _server(row) -> Server:
    """Decode one row of _COLUMNS; raises MalformedRow saying what a hand edit broke."""
    try:
        return _decode(row)
    except MalformedRow:
        raise
    except (ValueError, TypeError) as error:
        raise MalformedRow(str(error)) from None


_INT, _TEXT, _TIME = int, str, (int, float)
_OPTIONAL = type(None)


def _decode(row) -> Server:
    (id_, booking_id, user, uid, cards, uuids, model, alias, host, port, ctx, parallel, split_mode, metrics,
     cmdline, log_path, state, pid, pid_started, pgid, sup_pid, sup_started, sup_cmdline,
     created_at, ready_at, ended_at, exit_code, exit_signal, reason, log_tail, estimate, measured, api_key) = row
    for value, kind, column in (
        (booking_id, _INT, "booking_id"), (user, _TEXT, "user"), (uid, _INT, "uid"), (model, _TEXT, "model"),
        (alias, (_TEXT, _OPTIONAL), "alias"), (host, _TEXT, "host"), (port, _INT, "port"),
        (ctx, (_INT, _OPTIONAL), "ctx"), (parallel, (_INT, _OPTIONAL), "parallel"),
        (split_mode, (_TEXT, _OPTIONAL), "split_mode"), (metrics, _INT, "metrics"), (log_path, _TEXT, "log_path"),
        (state, _TEXT, "state"), (pid, (_INT, _OPTIONAL), "pid"), (pid_started, (*_TIME, _OPTIONAL), "pid_started"),
        (pgid, (_INT, _OPTIONAL), "pgid"), (sup_pid, (_INT, _OPTIONAL), "supervisor_pid"),
        (sup_started, (*_TIME, _OPTIONAL), "supervisor_started"), (created_at, _INT, "created_at"),
        (ready_at, (_INT, _OPTIONAL), "ready_at"), (ended_at, (_INT, _OPTIONAL), "ended_at"),
        (exit_code, (_INT, _OPTIONAL), "exit_code"), (exit_signal, (_INT, _OPTIONAL), "exit_signal"),
        (reason, (_TEXT, _OPTIONAL), "reason"), (api_key, (_TEXT, _OPTIONAL), "api_key"),
    ):
        need(value, kind, column)
    if state not in LIVE_STATES + FINAL_STATES:
        raise MalformedRow(f"state is {ascii(state)[:40]}")
    return Server(
        id=id_, booking_id=booking_id, user=user, uid=uid, cards=_json_list(cards, int, "cards"),
        card_uuids=_json_list(uuids, str, "card_uuids"), model=model, alias=alias, host=host, port=port, ctx=ctx,
        parallel=parallel, split_mode=split_mode, metrics=bool(metrics), cmdline=_json_list(cmdline, str, "cmdline"),
        log_path=log_path, state=state, pid=pid, pid_started=pid_started, pgid=pgid, supervisor_pid=sup_pid,
        supervisor_started=sup_started,
        supervisor_cmdline=_json_list(sup_cmdline, str, "supervisor_cmdline") if sup_cmdline else (),
        created_at=created_at, ready_at=ready_at, ended_at=ended_at, exit_code=exit_code, exit_signal=exit_signal,
        reason=reason, log_tail=_json_list(log_tail, str, "log_tail") if log_tail else (),
        estimate=_json_object(estimate, check_estimate, "estimate"),
        measured=_json_object(measured, check_measured, "measured"), api_key=api_key,
    )


def _json_list(text: Any, item: type, column: str) -> tuple:
    """A JSON list of `item`s stored as text, as a tuple; MalformedRow when it is anything else."""
    need(text, str, column)
    try:
        value = json.loads(text)
    except ValueError:
        raise MalformedRow(f"{column} is not JSON ({ascii(text)[:40]})") from None
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, item) for v in value):
        raise MalformedRow(f"{column} is not a JSON list of {item.__name__} ({ascii(text)[:40]})")
    return tuple(value)


def _json_object(text: Any, check, column: str) -> dict | None:
    """A JSON object stored as text (or NULL), as `check` accepts it; MalformedRow when it is anything else."""
    if text is None:
        return None
    need(text, str, column)
    try:
        return check(json.loads(text))
    except RecursionError:
        raise MalformedRow(f"{column} is nested too deeply") from None
    except ValueError as error:  # json.JSONDecodeError is one
        raise MalformedRow(f"{column} is not what board stores ({error}; {ascii(text)[:40]})") from None


# -- the JSON columns: what a client or a supervisor sends is checked against these shapes --------

MAX_CARDS = 64
MAX_DEVICES = 16  # llama.cpp buffers of one server: CUDA0..7, CUDA_Host, CPU, CPU_Mapped, ... with room to spare
MAX_MIB = 1 << 30  # a PiB: anything larger is junk, not a figure


def check_estimate(value: object) -> dict:
    """The estimate as stored: {"per_card_mib": [int, ...], "limit_mib": int, "fits": bool, "forced": bool}
    (app.fit.request.for_server), other keys dropped; ValueError saying what is wrong."""
    if not isinstance(value, dict):
        raise ValueError("the estimate is not an object")
    cards = value.get("per_card_mib")
    if not isinstance(cards, list) or not 0 < len(cards) <= MAX_CARDS or not all(_mib(v) for v in cards):
        raise ValueError("per_card_mib is not a list of whole MiB, one per card")
    if not _mib(value.get("limit_mib")):
        raise ValueError("limit_mib is not a whole number of MiB")
    for key in ("fits", "forced"):
        if not isinstance(value.get(key), bool):
            raise ValueError(f"{key} is not true or false")
    return {"per_card_mib": list(cards), "limit_mib": value["limit_mib"], "fits": value["fits"], "forced": value["forced"]}


def check_measured(value: object) -> dict:
    """What llama.cpp logged, as Measured.to_json writes it (normalised by a round trip through Measured), at most
    MAX_DEVICES buffers and kv caches; ValueError saying what is wrong."""
    if not isinstance(value, dict):
        raise ValueError("the measured memory is not an object")
    devices, caches = value.get("devices"), value.get("kv_caches")
    if isinstance(devices, dict) and len(devices) > MAX_DEVICES or isinstance(caches, list) and len(caches) > MAX_DEVICES:
        raise ValueError(f"more than {MAX_DEVICES} devices or caches")
    from app.llama.memory import Measured  # start-up: the log's memory parser loads only to read figures

    try:
        measured = Measured.from_json(value)
    except (ArithmeticError, RecursionError):  # an integer too large for a float
        measured = None
    if measured is None:
        raise ValueError("the measured memory is not llama.cpp's figures")
    if any(len(name) > 64 or not name.isprintable() for name in measured.devices):
        raise ValueError("a device name is too long or not printable")
    if any(memory.total_mib > MAX_MIB for memory in measured.devices.values()):
        raise ValueError("a device's figure is too large")
    return measured.to_json()


def _mib(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_MIB


def _decoded(conn: sqlite3.Connection, rows: Iterable) -> list[Server]:
    """The rows that decode; each one that does not is reported once (report_malformed) and skipped."""
    found = []
    for row in rows:
        try:
            found.append(_server(row))
        except MalformedRow as error:
            report_malformed(conn, "server", row[0], error)
    return found


def get(conn: sqlite3.Connection, server_id: int) -> Server | None:
    """The server, or None when there is none or its row is malformed (which is reported)."""
    row = conn.execute(f"SELECT {_COLUMNS} FROM servers WHERE id = ?", (server_id,)).fetchone()
    found = _decoded(conn, [row]) if row else []
    return found[0] if found else None


def listing(
    conn: sqlite3.Connection, *, live_only: bool = False, user: str | None = None, booking_id: int | None = None,
    fleet_host: str | None = None, limit: int | None = None,
) -> list[Server]:
    """Newest first. `fleet_host`: only the servers on that [fleet] host's cards (and rows from before the fleet)."""
    clauses: list[str] = []
    args: list[int | str] = []
    if live_only:
        clauses.append(f"state IN ({','.join('?' * len(LIVE_STATES))})")
        args.extend(LIVE_STATES)
    if user is not None:
        clauses.append('"user" = ?')
        args.append(user)
    if booking_id is not None:
        clauses.append("booking_id = ?")
        args.append(booking_id)
    if fleet_host is not None:
        clauses.append("fleet_host IN (?, '')")
        args.append(fleet_host)
    where = " WHERE " + " AND ".join(clauses) if clauses else ""
    tail = " LIMIT ?" if limit is not None else ""
    if limit is not None:
        args.append(limit)
    return _decoded(conn, conn.execute(f"SELECT {_COLUMNS} FROM servers{where} ORDER BY id DESC{tail}", args))


def live(conn: sqlite3.Connection, fleet_host: str | None = None) -> list[Server]:
    """Live servers; with `fleet_host`, only those on that [fleet] host's cards (and rows from before the fleet):
    a service reconciles and stops only its own host's servers, whose pids mean something there."""
    return listing(conn, live_only=True, fleet_host=fleet_host)


def used_ports(conn: sqlite3.Connection) -> set[int]:
    marks = ",".join("?" * len(LIVE_STATES))
    return {r[0] for r in conn.execute(f"SELECT port FROM servers WHERE state IN ({marks})", LIVE_STATES)}


def ended_bookings(conn: sqlite3.Connection, now: int, fleet_host: str) -> list[Server]:
    """Live servers on `fleet_host`'s cards (or from before the fleet) whose booking has ended or was cancelled,
    or changed hands (an admin's reassign: a server is its starter's, never the new holder's)."""
    marks = ",".join("?" * len(LIVE_STATES))
    ids = [
        r[0] for r in conn.execute(
            f"SELECT s.id FROM servers AS s JOIN bookings AS b ON b.id = s.booking_id"
            f" WHERE s.state IN ({marks}) AND s.fleet_host IN (?, '')"
            " AND (b.status != 'booked' OR b.ends_at <= ? OR b.uid != s.uid)"
            " ORDER BY s.id",
            [*LIVE_STATES, fleet_host, now],
        )
    ]
    return [s for s in (get(conn, i) for i in ids) if s]


def insert(
    conn: sqlite3.Connection, *, booking_id: int, user: str, uid: int, cards: Iterable[int], card_uuids: Iterable[str],
    model: str, alias: str | None, host: str, port: int, ctx: int | None, parallel: int | None,
    split_mode: str | None, metrics: bool, cmdline: Iterable[str], now: int, estimate: dict | None = None,
    fleet_host: str = "",
) -> int:
    """A new server row; `host` is the address it listens on, `fleet_host` the [fleet] host whose cards it runs on."""
    cursor = conn.execute(
        "INSERT INTO servers (booking_id, \"user\", uid, cards, card_uuids, model, alias, host, port, ctx, parallel,"
        " split_mode, metrics, cmdline, state, created_at, estimate, fleet_host)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (booking_id, user, uid, json.dumps(list(cards)), json.dumps(list(card_uuids)), model, alias, host, port, ctx,
         parallel, split_mode, int(metrics), json.dumps(list(cmdline)), STARTING, now,
         json.dumps(estimate) if estimate is not None else None, fleet_host),
    )
    assert cursor.lastrowid is not None  # an INSERT that ran numbers its row
    return cursor.lastrowid


def set_measured(conn: sqlite3.Connection, server_id: int, measured: dict) -> None:
    """Record what llama.cpp logged at load (check_measured's shape)."""
    conn.execute("UPDATE servers SET measured = ? WHERE id = ?", (json.dumps(measured), server_id))


def set_log_path(conn: sqlite3.Connection, server_id: int, path: str) -> None:
    conn.execute("UPDATE servers SET log_path = ? WHERE id = ?", (path, server_id))


API_KEY_MAX = 200


def check_api_key(value: object) -> str | None:
    """A key a supervisor sent: printable ASCII without spaces, at most API_KEY_MAX characters; None otherwise."""
    if isinstance(value, str) and 16 <= len(value) <= API_KEY_MAX and value.isascii() and value.isprintable() \
            and " " not in value:
        return value
    return None


def set_api_key(conn: sqlite3.Connection, server_id: int, key: str) -> None:
    conn.execute("UPDATE servers SET api_key = ? WHERE id = ?", (key, server_id))


def set_supervisor(conn: sqlite3.Connection, server_id: int, pid: int, started: float | None,
                   cmdline: Iterable[str], pgid: int) -> None:
    conn.execute(
        "UPDATE servers SET supervisor_pid = ?, supervisor_started = ?, supervisor_cmdline = ?, pgid = ? WHERE id = ?",
        (pid, started, json.dumps(list(cmdline)), pgid, server_id),
    )


def set_process(conn: sqlite3.Connection, server_id: int, pid: int, started: float | None,
                cmdline: Iterable[str], *, only_if_unset: bool = False) -> None:
    conn.execute(
        "UPDATE servers SET pid = ?, pid_started = ?, cmdline = ? WHERE id = ?"
        + (" AND pid IS NULL" if only_if_unset else ""),
        (pid, started, json.dumps(list(cmdline)), server_id),
    )


def transition(conn: sqlite3.Connection, server_id: int, from_states: Iterable[str], to_state: str,
               **fields: Any) -> bool:
    """Move a server to `to_state` only if it is in one of `from_states`; True when this call moved it.

    Several processes may race to record the same ending (the supervisor, the stopper, a reconciling
    board); the conditional update makes the first one win and the others no-ops.
    """
    from_states = list(from_states)
    sets, args = ["state = ?"], [to_state]
    for name, value in fields.items():
        if name == "log_tail" and value is not None:
            value = json.dumps(list(value))
        sets.append(f"{name} = ?")
        args.append(value)
    marks = ",".join("?" * len(from_states))
    cursor = conn.execute(
        f"UPDATE servers SET {', '.join(sets)} WHERE id = ? AND state IN ({marks})", [*args, server_id, *from_states]
    )
    return cursor.rowcount == 1


def update(conn: sqlite3.Connection, server_id: int, **fields: Any) -> None:
    """Fill in fields without changing the state (exit information after a `failed`)."""
    sets, args = [], []
    for name, value in fields.items():
        if name == "log_tail" and value is not None:
            value = json.dumps(list(value))
        sets.append(f"{name} = ?")
        args.append(value)
    conn.execute(f"UPDATE servers SET {', '.join(sets)} WHERE id = ?", [*args, server_id])


def server_to_wire(server: Server) -> dict[str, Any]:
    """The row as the operations return it (JSON values); `server_from_wire` reads it back. Never the API key:
    `serve_key` gives it to those who may have it."""
    data = asdict(server)
    del data["api_key"]
    for name in ("cards", "card_uuids", "cmdline", "supervisor_cmdline", "log_tail"):
        data[name] = list(data[name])
    return data


def server_from_wire(data: dict[str, Any]) -> Server:
    values = dict(data)
    for name in ("cards", "card_uuids", "cmdline", "supervisor_cmdline", "log_tail"):
        values[name] = tuple(values.get(name) or ())
    return Server(**values)
