"""Settings: one root-owned TOML file plus environment overrides, read into typed sections.

Each section is a msgspec Struct, and ConfigFile is the file's shape: msgspec.convert checks every key's type on
load, and a wrong one is one line naming the section, the key and the value (_wrong words it). What a type cannot
say (zones, host:port, known classes, times of day) is checked next, section by section, in _checked.

Precedence for the database path: --db, then BOARD_DB, then [storage] db in the config
(BOARD_CONFIG, default /etc/board/board.toml), then /var/lib/board/board.db. A PostgreSQL store instead:
BOARD_DB_URL, then [storage] url (with an optional [storage] password_file).
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
from msgspec.structs import replace

from app.config_file import ConfigError, host_name, read_config

DEFAULT_DB_PATH = Path("/var/lib/board/board.db")
CLASSES = ("online", "batch", "finetune", "experiment")  # highest priority first


class Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A config section: its fields are the keys the file may set, with their types; any other key is refused."""


class ClassWindow(Section, frozen=True):
    """A class is allowed in a pool only between `start` and `end` local time (wrapping midnight), and at weekends if set.
    app.core.policy alone decides what it allows."""

    start_minute: int
    end_minute: int
    weekends: bool = True


class PoolWindow(Section, frozen=True):
    """A window as [pools.windows] writes it: `finetune = { hours = "19:00-09:00", weekends = true }`."""

    hours: str
    weekends: bool = True


class Pool(Section, frozen=True):
    name: str
    cards: tuple[int, ...]
    classes: tuple[str, ...] = CLASSES
    max_hours: float | None = None
    windows: dict[str, ClassWindow] = {}


class Policy(Section, frozen=True):
    max_booking_hours: float = 72.0
    max_ahead_days: float = 30.0
    max_cards_per_user: int = 8
    timezone: str | None = None  # windows are evaluated here; default the system's (the service's, not a client's)
    fair_share_half_life_days: float = 7.0  # a project's past use counts half after this long (the queue's order)
    idle_release_after_min: float | None = None  # a booking idle this long is given back; None: never
    idle_util_pct: float = 10.0  # at or under this utilisation, with none of its holder's processes, a card is idle
    idle_release_notice_min: float = 10.0  # the holder is told this long before an idle booking is released
    idle_release_grace_min: float = 30.0  # a booking is never released in its first minutes


class ProjectAllocation(Section, frozen=True):
    """Cards a project holds on a schedule ([[projects.allocations]]): only its members book them in those hours."""

    cards: tuple[int, ...] = ()
    pool: str | None = None  # or a [[pools]] entry's cards
    hours: str = "00:00-24:00"  # local hours (the policy zone), wrapping midnight: "19:00-09:00"
    days: str = "mon-sun"  # the days a window starts on: "mon-fri", "sat,sun"


class Project(Section, frozen=True):
    """[[projects]]: who books for it, what they may use, and what it may spend (app.core.projects)."""

    name: str
    members: tuple[str, ...]  # user names and @groups
    classes: tuple[str, ...] = CLASSES
    allocations: tuple[ProjectAllocation, ...] = ()
    gpu_hours: float | None = None  # booked card-hours per period; None: no budget
    period: str = "month"  # month | week: when the budget starts again (local midnight, the policy zone)
    tokens_per_day: int | None = None  # through the gateway, prompt and completion together
    rpm: int | None = None  # gateway requests a minute, the project's keys together
    tpm: int | None = None  # gateway tokens a minute, the project's keys together
    share: float = 1.0  # its weight in fair share


class PreloadWindow(Section, frozen=True):
    """When a catalog model is kept warm: local hours (the policy zone) on the days a window starts on."""

    hours: str = "00:00-24:00"  # "09:00-19:00"; "19:00-09:00" wraps midnight
    days: str = "mon-sun"  # "mon-fri", "sat,sun"


class CatalogModel(Section, frozen=True):
    """[[models]]: a model the gateway starts on free cards when a keyed request names its alias, and gives back when
    idle (docs/gateway.md, app.service.rules.ondemand). Its cards are not named: the fit estimate says how many."""

    alias: str  # what clients send as "model"
    model: str  # the GGUF file, under [llama] model_dirs
    ctx: int = 4096  # total context, shared by the slots
    parallel: int = 1  # slots
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    args: tuple[str, ...] = ()  # extra llama-server arguments: `serve start`'s allow-list (app.llama.flags)
    pool: str | None = None  # its cards come from this [[pools]] entry; None: any card
    project: str | None = None  # billed to; a board with [[projects]] names one
    klass: str = msgspec.field(name="class", default="online")  # the booking's class
    ttl_s: float = 600.0  # idle this long: drained, stopped, its booking released
    preload: PreloadWindow | None = None  # kept warm in these hours, whether asked or not
    fallbacks: tuple[str, ...] = ()  # other catalog aliases that answer when this one is cold and nothing is free


class LlamaSettings(Section, frozen=True):
    server_bin: str | None = None
    port_min: int = 8100
    port_max: int = 8199
    host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ("127.0.0.1",)
    model_dirs: tuple[str, ...] = ()
    ready_timeout_s: float = 300.0
    log_dir: str | None = None  # default: beside the database, in servers/
    runner_user: str = "board-llama"  # the system user of `board runner`, which starts planned servers


class ServiceSettings(Section, frozen=True):
    """The shared install: members reach the service on this socket instead of opening the database."""

    socket: str | None = None
    group: str = "board"  # the members; the socket is 0660 to this group
    max_connections: int = 512  # at once, everyone's; lowered at start where the open-file limit is too low for it
    max_connections_per_uid: int = 64
    idle_timeout_s: float = 300.0  # a connection that sends no request for this long is closed


class EnforceSettings(Section, frozen=True):
    grace_s: float = 60.0  # SIGTERM, then SIGKILL this long after, for jobs whose booking ended
    run_jobs: str = "stop"  # stop | warn
    interval_s: float = 5.0


class MetricsSettings(Section, frozen=True):
    """`listen = "127.0.0.1:9400"`: the service serves Prometheus's /metrics there (app.service.box.metrics); unset: off."""

    listen: str | None = None

    @property
    def address(self) -> tuple[str, int]:
        """(host, port); an IPv6 host is written in brackets, "[::1]:9400"."""
        host, _, port = str(self.listen).rpartition(":")
        return host.removeprefix("[").removesuffix("]"), int(port)


class FitSettings(Section, frozen=True):
    """Memory accounting (board fit, book --model, serve start's check)."""

    overhead_mib: float = 500.0  # per card: the CUDA context and libraries' workspaces on an RTX 5090
    max_fill: float = 0.90  # each card stays at or below this share of its memory
    card_mib: float | None = None  # a card's memory; default what the fleet reports (32607 for an RTX 5090)


class BookingSettings(Section, frozen=True):
    """How booking words read: `tonight` starts at `night_start` (local time, HH:MM)."""

    night_start: str = "19:00"

    @property
    def night_start_minute(self) -> int:
        return _hhmm(self.night_start)


class HistorySettings(Section, frozen=True):
    """What the service records of the cards (app.history): a sample every `sample_s`, raw for `raw_hours`,
    5-minute rollups for `rollup_days`. `db`: the history file; default beside the board's, <name>.history.db."""

    enabled: bool = True
    sample_s: float = 10.0
    raw_hours: float = 48.0
    rollup_days: float = 365.0
    db: str | None = None


class FleetSettings(Section, frozen=True):
    """[fleet]: several hosts' services on one database (docs/configuration.md). `host`: this host's name in the
    fleet (default: the short hostname); a host whose heartbeat is older than `heartbeat_timeout_s` is HOST DOWN."""

    host: str = ""
    heartbeat_timeout_s: float = 30.0


class ReportSettings(Section, frozen=True):
    """`board report`: a card in IN USE counts as used only at a mean utilisation of `busy_util` % or more."""

    busy_util: float = 10.0


class NotifyTarget(Section, frozen=True):
    """Where pushes go (app.notify). The url holds the secret (a robot key, a webhook path): never logged or shown.

    The config is readable by every member, so `url_file` may name a file only the service reads instead;
    it is read when a push is sent, never by the members' commands."""

    name: str
    type: str  # wecom | slack | webhook
    url: str = ""  # secret: __repr__ leaves it out
    url_file: str | None = None

    def __repr__(self) -> str:
        return f"NotifyTarget(name={self.name!r}, type={self.type!r}, url_file={self.url_file!r})"

    def address(self) -> str:
        """The url; from `url_file` if that is where it is (raises OSError or ValueError when it can't be used)."""
        if not self.url_file:
            return self.url
        with open(self.url_file, encoding="utf-8") as file:
            url = file.read(4096).strip()
        if not _web_address(url):
            raise ValueError("its url_file does not hold an http:// or https:// address")
        return url


def _web_address(url: str) -> bool:
    from urllib.parse import urlsplit  # start-up: only a config with [[notify.targets]] parses urls

    try:
        parts = urlsplit(url)
        return parts.scheme in ("http", "https") and bool(parts.hostname) and "\n" not in url
    except ValueError:
        return False


class NotifySettings(Section, frozen=True):
    targets: tuple[NotifyTarget, ...] = ()
    summary_at: tuple[str, ...] = ("09:00",)  # local times (policy zone) of the board summary
    timeout_s: float = 5.0  # per HTTP request
    max_attempts: int = 8  # then the message is given up


class AlertSettings(Section, frozen=True):
    """The alert rules' thresholds and windows (app.alerts.rules); `quiet` ("22:00-08:00", local time) holds the
    team-chat pushes back, `repeat_min` keeps a rule that fires again so soon from pushing again, and a finding
    fires only once it has held `fire_after_s` (a card squatted for the moment between a release and a rebook
    does not)."""

    enabled: bool = True
    fire_after_s: float = 60.0
    window_min: float = 60.0  # utilisation, queue growth and waits are measured over this window
    util_low_pct: float = 30.0
    util_high_pct: float = 85.0
    wait_min: float = 30.0
    vram_pct: float = 90.0
    faults_month: int = 3  # more than this many OOM or Xid faults in 30 days
    hot_c: float = 92.0
    idle_booked_min: float = 30.0
    crashed_min: float = 60.0  # a server that crashed this recently
    ending_min: float = 10.0
    repeat_min: float = 60.0
    quiet: str | None = None

    def quiet_minutes(self) -> tuple[int, int] | None:
        if not self.quiet:
            return None
        start, end = self.quiet.split("-")
        return _hhmm(start), _hhmm(end)


class GatewaySettings(Section, frozen=True):
    """[gateway]: `board gateway`, the team's OpenAI-compatible front door (docs/gateway.md)."""
    listen: str = "127.0.0.1:8080"
    user: str = "board-gateway"  # the only account (besides root) the service gives the servers' keys to
    drain_s: float = 30.0  # a server whose booking ends within this gets no new requests
    queue_timeout_s: float = 30.0  # a request waits this long for a free slot, then 429
    max_body_mb: float = 16.0
    max_concurrent_per_user: int = 8  # a member's requests in flight or waiting, across all their keys, then 429
    max_keys_per_user: int = 20  # live keys a member issues themselves; keys an admin issues for an account are apart
    log_bodies: bool = False
    # [gateway.team_aliases] alias = ["alice", "@serving"]: the aliases that several members serve, and who may
    # (users, and @groups' members). Any other alias has one holder at a time (app.llama.aliases).
    team_aliases: dict[str, tuple[str, ...]] = {}
    # The old names this config used (max_concurrent_per_key, now max_concurrent_per_user): the gateway says so at start.
    _renamed: tuple[str, ...] = ()
    # The door's limits (app.gateway.connections): a stranger's idle or slow connections cannot hold its files
    head_timeout_s: float = 10.0  # a request's head, from its connection's start or its first byte after an answer
    body_timeout_s: float = 60.0  # a request's body, once its head is read; then 408
    idle_timeout_s: float = 30.0  # a connection with no request in progress is closed after this
    max_connections: int = 4096  # at once, everyone's; lowered at start where the open-file limit is too low
    max_connections_per_address: int = 256  # from one client address (a proxy in front is one address: raise it)
    key_rpm: int | None = None  # requests a minute per key; None: no limit
    key_tpm: int | None = None  # tokens a minute per key (prompt and completion); None: no limit


class PowerSettings(Section, frozen=True):
    """[power]: the limit every card should run at (the seeds cap 575 W cards at 500 W and lose about 5 % of decode
    speed), per-card overrides in [power.cards] ("3" = 450), and the pause between cards in `board power apply`
    (the seeds' staged power-on: one card at a time)."""

    limit_w: float | None = None
    cards: dict[int, float] = {}
    pause_s: float = 2.0

    def policy_w(self, index: int) -> float | None:
        return self.cards.get(index, self.limit_w)


class StorageSettings(Section, frozen=True):
    """[storage]: Config's db_path, storage_url and storage_password_file (env overrides apply there)."""

    db: str = str(DEFAULT_DB_PATH)
    url: str | None = None
    password_file: str | None = None


class AccessSettings(Section, frozen=True):
    admin_group: str = "board-admin"


class DisplaySettings(Section, frozen=True):
    refresh_seconds: float = 1.0
    hot_celsius: int = 90


class PostgresStore(msgspec.Struct, frozen=True):
    """[storage] url: the board's store is this PostgreSQL database (a libpq URI), shared by every host's service.
    `password_file` holds the role's password (the reader's own file, mode 0600 or 0400); `host` names this host
    in the database's view (application_name) and in the one line an unreachable database gets."""

    url: str
    password_file: Path | None = None
    host: str = ""


class Sections(Section, frozen=True):
    """The sections that Config keeps as the file has them (ConfigFile adds the three it flattens)."""

    labels: dict[int, str] = {}
    service: ServiceSettings = ServiceSettings()
    enforce: EnforceSettings = EnforceSettings()
    booking: BookingSettings = BookingSettings()
    report: ReportSettings = ReportSettings()
    history: HistorySettings = HistorySettings()
    fleet: FleetSettings = FleetSettings()
    metrics: MetricsSettings = MetricsSettings()
    policy: Policy = Policy()
    # [classes]: who may use a class (user names, @groups), for bookings and keys alike; a class not named: everyone.
    classes: dict[str, tuple[str, ...]] = {}
    pools: tuple[Pool, ...] = ()
    projects: tuple[Project, ...] = ()  # none: one implicit project that every member books for
    models: tuple[CatalogModel, ...] = ()  # the team's catalog of models started on demand
    llama: LlamaSettings = LlamaSettings()
    fit: FitSettings = FitSettings()
    gateway: GatewaySettings = GatewaySettings()
    notify: NotifySettings = NotifySettings()
    alerts: AlertSettings = AlertSettings()
    power: PowerSettings = PowerSettings()


class ConfigFile(Sections, frozen=True):
    """The file's shape: one field per section. A key added to a section is typed, checked on load and (a test
    sees to it) documented in docs/configuration.md."""

    storage: StorageSettings = StorageSettings()
    access: AccessSettings = AccessSettings()
    display: DisplaySettings = DisplaySettings()


class Config(Sections, frozen=True):
    """The settings in use: the file's sections, with [storage], [access] and [display] flattened here and the
    environment's overrides applied (load_config)."""

    path: Path | None = None  # the file it was read from, if any
    db_path: Path = DEFAULT_DB_PATH
    storage_url: str | None = None  # a PostgreSQL store ([storage] url, BOARD_DB_URL); None: SQLite at db_path
    storage_password_file: Path | None = None
    admin_group: str = "board-admin"
    refresh_seconds: float = 1.0
    hot_celsius: int = 90

    @property
    def store(self) -> Path | PostgresStore:
        """What app.store.db.connect opens: the PostgreSQL database when a url is set, else the SQLite file."""
        if self.storage_url:
            return PostgresStore(self.storage_url, self.storage_password_file, self.fleet_host)
        return self.db_path

    @property
    def history_path(self) -> Path:
        if self.history.db:
            return Path(self.history.db).expanduser()
        return self.db_path.with_name(self.db_path.stem + ".history.db")

    @property
    def fleet_host(self) -> str:
        """This host's name in the fleet: [fleet] host, else the short hostname."""
        return host_name(self.fleet.host)


def load_config(db: str | os.PathLike | None = None, environ: os._Environ | dict = os.environ) -> Config:
    name, raw = read_config(environ)
    path = Path(name)
    try:
        config = _from_toml(raw, path if raw else None)
    except (KeyError, TypeError, ValueError) as error:
        raise ConfigError(f"bad config {path}: {error}") from None
    db_path = db or environ.get("BOARD_DB")
    if db_path:
        config = replace(config, db_path=Path(db_path).expanduser())
    if url := environ.get("BOARD_DB_URL"):
        config = replace(config, storage_url=url)
    return config


def _hhmm(text: str) -> int:
    hours, minutes = text.strip().split(":")
    value = int(hours) * 60 + int(minutes)
    if not 0 <= value <= 24 * 60:
        raise ValueError(f"time {text!r} is outside 00:00-24:00")
    return value


def _from_toml(raw: dict, path: Path | None) -> Config:
    table, renamed = _prepared(raw)
    try:
        file = msgspec.convert(table, ConfigFile, str_keys=True)
    except msgspec.ValidationError as error:
        raise ValueError(_wrong(str(error), table)) from None
    file = _checked(file, renamed)
    storage = file.storage
    return Config(
        path=path,
        db_path=Path(storage.db),
        storage_url=storage.url or None,
        storage_password_file=Path(storage.password_file).expanduser() if storage.password_file else None,
        admin_group=file.access.admin_group,
        refresh_seconds=file.display.refresh_seconds,
        hot_celsius=file.display.hot_celsius,
        **{name: getattr(file, name) for name in Sections.__struct_fields__},
    )


def _prepared(raw: dict) -> tuple[dict, tuple[str, ...]]:
    """The file's tables as ConfigFile takes them, and the old key names read as new ones: [gateway]'s old limit
    renamed, a [[notify.targets]] without a name named after its type, [pools.windows]' hours read as minutes."""
    table = dict(raw)
    renamed: tuple[str, ...] = ()
    gateway = table.get("gateway")
    if isinstance(gateway, dict):
        gateway = table["gateway"] = dict(gateway)
        if "_renamed" in gateway:  # the loader's own field, never the file's
            raise ValueError(_wrong("Object contains unknown field `_renamed` - at `$.gateway`", table))
        if "max_concurrent_per_key" in gateway:  # its old name: a config written for per-key limits still loads
            if "max_concurrent_per_user" in gateway:
                raise ValueError("[gateway] max_concurrent_per_key is the old name of max_concurrent_per_user (now"
                                 " counted across all of a member's keys); keep only max_concurrent_per_user")
            gateway["max_concurrent_per_user"] = gateway.pop("max_concurrent_per_key")
            renamed = ("max_concurrent_per_key",)
    notify = table.get("notify")
    if isinstance(notify, dict) and isinstance(notify.get("targets"), list):
        targets = []
        for number, entry in enumerate(notify["targets"], 1):
            if isinstance(entry, dict) and not entry.get("name"):
                kind = entry.get("type")
                entry = {**entry, "name": kind if isinstance(kind, str) and kind else f"target {number}"}
            targets.append(entry)
        table["notify"] = {**notify, "targets": targets}
    if isinstance(table.get("pools"), list):
        table["pools"] = [_windows(entry, number, table) for number, entry in enumerate(table["pools"])]
    return table, renamed


def _windows(entry: object, number: int, table: dict) -> object:
    """A [[pools]] entry with its windows as ClassWindows (hours "19:00-09:00" read as minutes of the day)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("windows"), dict):
        return entry  # msgspec words what is wrong with it
    windows = {}
    for klass, window in entry["windows"].items():
        if klass not in CLASSES:
            raise ValueError(f"pool {entry.get('name')!r}: unknown class {str(klass)[:20]!r}")
        at = ("pools", number, "windows", klass)
        try:
            hours = msgspec.convert(window, PoolWindow)
        except msgspec.ValidationError as error:
            raise ValueError(_wrong(str(error), table, at, PoolWindow)) from None
        start, _, end = hours.hours.partition("-")
        try:
            windows[klass] = ClassWindow(_hhmm(start), _hhmm(end), hours.weekends)
        except ValueError as error:
            why = error if "outside" in str(error) else 'give local hours such as "19:00-09:00"'
            raise ValueError(f"[[pools]] #{number + 1} windows.{klass}.hours is {hours.hours[:20]!r}; {why}") from None
    return {**entry, "windows": windows}


_WORDS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false", "array": "a list",
          "object": "a table"}


def _wrong(message: str, table: dict, at: tuple[str | int, ...] = (), root: type | None = None) -> str:
    """msgspec's ValidationError in the config's words, one line: "Expected `float`, got `str` - at
    `$.policy.max_booking_hours`" is `[policy] max_booking_hours: expected a number, got "12"`.

    `at` and `root`: where in the file a part converted on its own (a pool's window) lies, and its type."""
    import re
    import types
    import typing

    what, _, where = message.partition(" - at `")
    in_key = where.startswith("key` in `")
    steps = list(at) + re.findall(r"\.([^.\[`]+)|\[(\d+|\.\.\.)\]", where.removeprefix("key` in `"))
    path: list[str | int] = []
    kind: object = ConfigFile
    value: object = table
    tables = 0  # how many of the steps name the array of tables an entry is in: [[pools]] #2
    for number, step in enumerate(steps):
        if number == len(at) and root is not None:
            kind = root
        name, index = step if isinstance(step, tuple) else (step, "") if isinstance(step, str) else ("", step)
        hints = typing.get_type_hints(kind) if isinstance(kind, type) and issubclass(kind, msgspec.Struct) else {}
        if name and hints:  # a field of a section
            kind, value = hints.get(name), value.get(name) if isinstance(value, dict) else None
        elif index == "..." or name:  # a key of a table such as [labels]: msgspec does not say which
            name = name or _culprit(value, kind)
            kind = typing.get_args(kind)[1]
            value = value.get(name) if isinstance(value, dict) else None
        else:
            index = int(index)
            kind = typing.get_args(kind)[0]
            value = value[index] if isinstance(value, list) and index < len(value) else None
            if tables == 0 and all(isinstance(p, str) for p in path) and _is_section(kind):
                tables = len(path) + 1
        if isinstance(kind, types.UnionType):  # X | None: X
            kind = next(k for k in typing.get_args(kind) if k is not type(None))
        path.append(name if name else index)
    if root is not None and len(steps) == len(at):  # the error is at the part itself
        kind = root
    location = _location(path, tables)
    if what.startswith("Object contains unknown field"):
        unknown = what.split("`")[1]
        if not path:
            return (f"unknown section(s) {', '.join(sorted(set(table) - set(ConfigFile.__struct_fields__)))};"
                    f" known sections: {', '.join(sorted(ConfigFile.__struct_fields__))}")
        known = sorted(name for name in getattr(kind, "__struct_fields__", ()) if not name.startswith("_"))
        return f"unknown key {unknown[:40]!r} in {location}; known keys: {', '.join(known)}"
    if what.startswith("Object missing required field"):
        return f"{location}: {what.split('`')[1]} is required"
    expected = re.match(r"Expected `([^`]+)`, got `\w+`", what)
    if expected is None:
        return f"{location}: {what}"
    words = " or ".join(_WORDS.get(t, t) for t in expected[1].split(" | ") if t != "null")
    if in_key:
        return f"{location}: expected {words} for a key, got {_shown(_culprit(value, kind))}"
    shown = _shown(value)
    if "url" in path and not isinstance(value, int | float):  # a notify target's url is a secret: not even in a list
        shown = "a table" if isinstance(value, dict) else "a list" if isinstance(value, list) else "a date or time"
    return f"{location}: expected {words}, got {shown}"


def _culprit(table: object, kind: object) -> str:
    """The key of `table` whose entry msgspec refused (the first, as msgspec stops at the first) as a `kind`."""
    for key, value in table.items() if isinstance(table, dict) else ():
        try:
            msgspec.convert({key: value}, kind, str_keys=True)
        except msgspec.ValidationError:
            return key
    return "?"


def _is_section(kind: object) -> bool:
    return isinstance(kind, type) and issubclass(kind, Section)


def _location(path: list[str | int], tables: int) -> str:
    """`[policy] max_booking_hours`, `[[pools]] #2 cards[0]`, `[gateway] team_aliases.team-llm[1]`."""
    if not path:
        return "the file"
    if tables:
        head = f"[[{'.'.join(str(p) for p in path[:tables - 1])}]] #{int(path[tables - 1]) + 1}"
        rest = path[tables:]
    else:
        head, rest = f"[{path[0]}]", path[1:]
    text = ""
    for part in rest:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            bare = part and all(c.isascii() and (c.isalnum() or c in "-_") for c in part)
            text += ("." if text else "") + (part if bare else _shown(part))
    return f"{head} {text}" if text else head


def _shown(value: object) -> str:
    """A value as the file wrote it, near enough (JSON is TOML's syntax for these), and short."""
    import json

    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _checked(file: ConfigFile, renamed: tuple[str, ...]) -> ConfigFile:
    """What a type cannot say, section by section; each raises a ValueError naming its section."""
    _policy(file.policy)
    _pools(file.pools)
    _projects(file.projects, file.pools)
    _storage(file.storage)
    _classes(file.classes)
    _fleet(file.fleet)
    _power(file.power)
    _report(file.report)
    _history(file.history)
    _notify(file.notify)
    _alerts(file.alerts)
    _booking(file.booking)
    _fit(file.fit)
    _metrics(file.metrics)
    _enforce(file.enforce)
    _models(file.models, file.pools, file.projects, file.gateway.team_aliases, file.llama.model_dirs)
    return replace(file, gateway=_gateway(file.gateway, renamed))


DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
PERIODS = ("month", "week")


def parse_hours(text: str) -> tuple[int, int]:
    """"09:00-19:00" as minutes of the day (start, end); an end at or before the start wraps past midnight. A window
    opens before 24:00: one that opened at 24:00 would open on the next day, which its days do not name."""
    start, dash, end = text.strip().partition("-")
    if not dash:
        raise ValueError(text)
    minutes = []
    for part in (start, end):
        hours, colon, mins = part.strip().partition(":")
        if not (colon and hours.isascii() and hours.isdigit() and mins.isascii() and mins.isdigit() and len(mins) == 2):
            raise ValueError(text)
        value = int(hours) * 60 + int(mins)
        if int(mins) >= 60 or value > 24 * 60:
            raise ValueError(text)
        minutes.append(value)
    if minutes[0] == 24 * 60:
        raise ValueError(text)
    return minutes[0], minutes[1]


def parse_days(text: str) -> frozenset[int]:
    """"mon-fri", "sat,sun", "mon,wed-fri" as weekday numbers (Monday 0); "fri-mon" wraps the week."""
    found: set[int] = set()
    for part in text.lower().replace(" ", "").split(","):
        first, dash, last = part.partition("-")
        if first not in DAYS or (dash and last not in DAYS):
            raise ValueError(text)
        a, b = DAYS.index(first), DAYS.index(last) if dash else DAYS.index(first)
        found.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    return frozenset(found)


_PROJECT_NAME = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_."
WEEK_MINUTES = 7 * 24 * 60


def _projects(projects: tuple[Project, ...], pools: tuple[Pool, ...]) -> None:
    """[[projects]]: a name a member types (--project), members, known classes, allocations that parse and hold no
    card for two projects at once, positive budgets and limits. Each line names the entry (#N, as a type error's
    does, and its name) and the key."""
    names: dict[str, int] = {}
    held: list[tuple[str, str, frozenset[int], list[tuple[int, int]]]] = []  # (where, project, cards, week minutes)
    pool_cards = {pool.name: pool.cards for pool in pools}
    for number, project in enumerate(projects, 1):
        where = f"[[projects]] #{number}"
        # A name starts with a letter or digit: "--project -x" would read as an option.
        if not (0 < len(project.name) <= 40 and all(c in _PROJECT_NAME for c in project.name)
                and project.name[0].isalnum()):
            raise ValueError(f"{where} name is {project.name[:40]!r}; give 1 to 40 letters, digits, '-', '_' or '.',"
                             " starting with a letter or digit")
        if project.name in names:
            raise ValueError(f"{where} name {project.name!r} is #{names[project.name]}'s too; give each project its"
                             " own name")
        names[project.name] = number
        where = f"{where} ({project.name})"
        if not project.members or not all(_account(m.removeprefix("@")) for m in project.members):
            raise ValueError(f"{where} members is {repr(list(project.members))[:40]}; give a list of user names and"
                             " @groups, such as [\"alice\", \"@ml\"]")
        if not project.classes or (bad := [c for c in project.classes if c not in CLASSES]):
            shown = repr(bad[0])[:20] if project.classes else "empty"
            raise ValueError(f"{where} classes: {shown} is not a class; name one or more of {', '.join(CLASSES)}")
        if project.period not in PERIODS:
            raise ValueError(f"{where} period is {project.period[:20]!r}; use \"month\" or \"week\"")
        for key in ("gpu_hours", "tokens_per_day", "rpm", "tpm", "share"):
            value = getattr(project, key)
            if value is not None and not 0 < value < float("inf"):  # NaN and inf: no budget anyone can read
                raise ValueError(f"{where} {key} must be a number more than 0, not {repr(value)[:20]}")
        for index, allocation in enumerate(project.allocations):
            at = f"{where} allocations[{index}]"  # a list's item by index, as a type error names it
            if (allocation.pool is None) == (not allocation.cards):
                raise ValueError(f"{at}: give cards or a pool, {'not both' if allocation.cards else 'one of them'}")
            if allocation.pool is not None and allocation.pool not in pool_cards:
                known = f"the pools are {', '.join(pool_cards)}" if pool_cards else "there are no [[pools]]"
                raise ValueError(f"{at}.pool {allocation.pool[:40]!r} is not a [[pools]] name; {known}")
            if any(card < 0 for card in allocation.cards):
                raise ValueError(f"{at}.cards are card numbers, 0 or more")
            try:
                first, last = parse_hours(allocation.hours)
            except ValueError:
                raise ValueError(f"{at}.hours is {allocation.hours[:20]!r}; give local hours such as"
                                 " \"09:00-19:00\" or \"19:00-09:00\"") from None
            try:
                days = parse_days(allocation.days)
            except ValueError:
                raise ValueError(f"{at}.days is {allocation.days[:20]!r}; give days such as \"mon-fri\" or"
                                 " \"sat,sun\"") from None
            cards = frozenset(pool_cards[allocation.pool] if allocation.pool is not None else allocation.cards)
            length = (last - first) % 1440 or 1440
            week = [(day * 1440 + first, day * 1440 + first + length) for day in days]
            week += [(a - WEEK_MINUTES, b - WEEK_MINUTES) for a, b in week if b > WEEK_MINUTES]  # Sunday night
            for other, owner, taken, minutes in held:
                if owner != project.name and cards & taken and any(a < d and c < b for a, b in week for c, d in minutes):
                    both = ",".join(map(str, sorted(cards & taken)))
                    raise ValueError(f"{at} holds cards {both} in hours that {other} holds them too; give each card to"
                                     " one project at a time")
            held.append((at, project.name, cards, week))


def _alias_text(alias: str) -> bool:
    """An alias as the gateway matches a request's "model" against it: 1 to 200 printable characters."""
    return 0 < len(alias) <= 200 and alias.isprintable()


def _models(models: tuple[CatalogModel, ...], pools: tuple[Pool, ...], projects: tuple[Project, ...],
            team_aliases: dict[str, tuple[str, ...]], model_dirs: tuple[str, ...]) -> None:
    """[[models]]: what the text alone says, the first bad entry in one line naming it (#N and its alias) and the key.
    What llama.cpp's facts say (its slot limit, cache types, the extra arguments' allow-list) and whether its file
    exists, is a GGUF and fits this box's cards is app.llama.catalog's (board agent, at start: the layers above)."""
    if not models:
        return  # a board without a catalog loads none of what checks one
    pool_of = {pool.name: pool for pool in pools}
    project_of = {project.name: project for project in projects}
    dirs = [os.path.normpath(d) for d in model_dirs if os.path.isabs(d)]
    aliases: dict[str, int] = {}
    for number, entry in enumerate(models, 1):
        where = f"[[models]] #{number}"
        if not _alias_text(entry.alias):
            raise ValueError(f"{where} alias is {entry.alias[:40]!r}; give 1 to 200 printable characters, the name"
                             " clients send as \"model\"")
        if entry.alias in aliases:
            raise ValueError(f"{where} alias {entry.alias[:40]!r} is #{aliases[entry.alias]}'s too; give each entry its"
                             " own alias")
        aliases[entry.alias] = number
        where = f"{where} ({entry.alias[:40]})"
        if entry.alias in team_aliases:
            raise ValueError(f"{where} alias is a [gateway.team_aliases] name too, which members serve themselves;"
                             " give the catalog entry another alias")
        model = entry.model
        if not (model.endswith(".gguf") and os.path.isabs(model) and model.isprintable()):
            raise ValueError(f"{where} model is {model[:80]!r}; give the absolute path of a .gguf file")
        if ".." in model.split("/") or not dirs or not any(os.path.normpath(model).startswith(d.rstrip("/") + "/")
                                                           for d in dirs):
            shown = ", ".join(dirs) or "none is set"
            raise ValueError(f"{where} model {model[:80]} is not under [llama] model_dirs ({shown}); put the file under"
                             " one of them (without '..') or add its folder there")
        for key in ("ctx", "parallel"):
            if getattr(entry, key) < 1:
                raise ValueError(f"{where} {key} must be a whole number more than 0, not {getattr(entry, key)}")
        if entry.parallel > entry.ctx:  # each slot holds ctx / parallel tokens, at least one
            raise ValueError(f"{where} parallel is {entry.parallel}, more than its ctx ({entry.ctx}); give fewer slots"
                             " or more ctx")
        if entry.klass not in CLASSES:
            raise ValueError(f"{where} class is {entry.klass[:20]!r}; use one of {', '.join(CLASSES)}")
        if entry.pool is not None:
            pool = pool_of.get(entry.pool)
            if pool is None:
                known = f"the pools are {', '.join(pool_of)}" if pool_of else "there are no [[pools]]"
                raise ValueError(f"{where} pool {entry.pool[:40]!r} is not a [[pools]] name; {known}")
            if entry.klass not in pool.classes:
                raise ValueError(f"{where} class {entry.klass} is not allowed in pool {pool.name} (it allows"
                                 f" {', '.join(pool.classes)}); give another class or pool")
        if projects:
            project = project_of.get(entry.project) if entry.project is not None else None
            if project is None:
                said = f"names {entry.project[:40]!r}, not a [[projects]] name" if entry.project is not None else (
                    "is missing")
                raise ValueError(f"{where} project {said}; name the project it is billed to, one of"
                                 f" {', '.join(project_of)}")
            if entry.klass not in project.classes:
                raise ValueError(f"{where} class {entry.klass} is not one project {project.name} may book (it may"
                                 f" {', '.join(project.classes)}); give another class or project")
        elif entry.project is not None:
            raise ValueError(f"{where} project {entry.project[:40]!r}: this board has no [[projects]]; leave project out")
        if not 0 < entry.ttl_s < float("inf"):
            raise ValueError(f"{where} ttl_s must be a number of seconds more than 0, not {entry.ttl_s:g}")
        if entry.preload is not None:
            try:
                parse_hours(entry.preload.hours)
            except ValueError:
                raise ValueError(f"{where} preload.hours is {entry.preload.hours[:20]!r}; give local hours such as"
                                 " \"09:00-19:00\" or \"19:00-09:00\"") from None
            try:
                parse_days(entry.preload.days)
            except ValueError:
                raise ValueError(f"{where} preload.days is {entry.preload.days[:20]!r}; give days such as \"mon-fri\""
                                 " or \"sat,sun\"") from None
    for number, entry in enumerate(models, 1):
        where = f"[[models]] #{number} ({entry.alias[:40]})"
        for fallback in entry.fallbacks:
            if fallback == entry.alias:
                raise ValueError(f"{where} fallbacks names itself; name other [[models]] aliases")
            if fallback not in aliases:
                raise ValueError(f"{where} fallbacks: {fallback[:40]!r} is not a [[models]] alias; name other entries"
                                 f" of the catalog ({', '.join(a[:40] for a in aliases)})")
    fallbacks = {entry.alias: entry.fallbacks for entry in models}
    for number, entry in enumerate(models, 1):
        if cycle := _cycle(entry.alias, fallbacks):
            raise ValueError(f"[[models]] #{number} ({entry.alias[:40]}) fallbacks go round: {' -> '.join(cycle)};"
                             " drop one so that each chain ends")


def _cycle(start: str, fallbacks: dict[str, tuple[str, ...]]) -> list[str] | None:
    """A chain of fallbacks from `start` back to it, or None: depth first, each alias once."""
    seen: set[str] = set()

    def walk(path: list[str]) -> list[str] | None:
        for then in fallbacks.get(path[-1], ()):
            if then == start:
                return [*path, then]
            if then not in seen:
                seen.add(then)
                if found := walk([*path, then]):
                    return found
        return None

    return walk([start])


def _policy(policy: Policy) -> None:
    if not policy.fair_share_half_life_days > 0:
        raise ValueError("[policy] fair_share_half_life_days must be a number more than 0")
    if policy.idle_release_after_min is not None and not policy.idle_release_after_min > 0:
        raise ValueError("[policy] idle_release_after_min must be a number of minutes more than 0 (leave it out: off)")
    if not 0 <= policy.idle_util_pct <= 100:
        raise ValueError(f"[policy] idle_util_pct is a percentage, 0 to 100, not {repr(policy.idle_util_pct)[:20]}")
    for key in ("idle_release_notice_min", "idle_release_grace_min"):
        if getattr(policy, key) < 0:
            raise ValueError(f"[policy] {key} must be a number of minutes, 0 or more")
    if policy.timezone:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # start-up: only a config that names a zone loads zoneinfo

        try:
            ZoneInfo(policy.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"[policy] timezone {policy.timezone!r} is not a known time zone,"
                             " such as 'Europe/Berlin'") from None


def _pools(pools: tuple[Pool, ...]) -> None:
    for pool in pools:  # their windows' classes are checked as the windows are read (_windows)
        if bad := [c for c in pool.classes if c not in CLASSES]:
            raise ValueError(f"pool {pool.name!r}: unknown class {bad[0]!r}")


def _storage(storage: StorageSettings) -> None:
    if storage.url is not None and not storage.url.startswith(("postgresql://", "postgres://")):
        raise ValueError("[storage] url must be a PostgreSQL URI (postgresql://...)")


def _classes(classes: dict[str, tuple[str, ...]]) -> None:
    """[classes] online = ["@serving", "alice"]: a class named here is for those users and groups' members alone."""
    for klass, who in classes.items():
        if klass not in CLASSES:
            raise ValueError(f"[classes] {str(klass)[:20]!r} is not a class; use one of {', '.join(CLASSES)}")
        if not all(_account(w.removeprefix("@")) for w in who):
            raise ValueError(f"[classes] {klass} is {repr(list(who))[:40]}; give a list of user names and @groups,"
                             " such as [\"@serving\", \"alice\"]")


def _account(name: str) -> bool:
    """A user or group name as [classes] takes it: 1 to 64 printable characters, no space, '@' or ','."""
    return 0 < len(name) <= 64 and name.isprintable() and not any(c in name for c in " @,")


_HOST_NAME = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"


def _fleet(settings: FleetSettings) -> None:
    host = settings.host
    # A host name is typed in card specs (gpu2:0-3): letters, digits, '-' and '_', never a ':' or a space.
    if len(host) > 63 or any(c not in _HOST_NAME for c in host):
        raise ValueError(f"[fleet] host must be a short host name (letters, digits, '-', '_'), not {repr(host)[:40]}")
    if not 0 < settings.heartbeat_timeout_s <= 30:
        raise ValueError("[fleet] heartbeat_timeout_s must be more than 0 and at most 30,"
                         f" not {repr(settings.heartbeat_timeout_s)[:20]}")


def _gateway(settings: GatewaySettings, renamed: tuple[str, ...]) -> GatewaySettings:
    host_port(settings.listen, "[gateway] listen", "0.0.0.0:8080")
    if not settings.user:
        raise ValueError("[gateway] user is the gateway's account name, such as \"board-gateway\"")
    positive = ("max_body_mb", "max_concurrent_per_user", "max_keys_per_user", "head_timeout_s", "body_timeout_s",
                "idle_timeout_s", "max_connections", "max_connections_per_address")
    for key in ("key_rpm", "key_tpm"):
        if (value := getattr(settings, key)) is not None and value <= 0:
            raise ValueError(f"[gateway] {key} must be a number more than 0 (leave it out: no limit), not {value}")
    for key in ("drain_s", "queue_timeout_s", *positive):
        value = getattr(settings, key)
        if value < 0 or (key in positive and value <= 0):
            raise ValueError(f"[gateway] {key} must be a number more than 0, not {repr(value)[:20]}")
    return replace(settings, _renamed=renamed, team_aliases=_team_aliases(settings.team_aliases))


_ACCOUNT = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_."


def _team_aliases(table: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """[gateway.team_aliases]: alias = a list of user names and "@group"s, at least one."""
    example = '[gateway.team_aliases] team-llm = ["alice", "@serving"]'
    found = {}
    for alias, owners in table.items():
        where = f"[gateway.team_aliases] {alias[:40]!r}"
        if not (0 < len(alias) <= 200 and alias.isprintable()):
            raise ValueError(f"{where}: an alias is 1 to 200 printable characters")
        if not owners:
            raise ValueError(f"{where} is a list of users and @groups who may serve it, such as {example}")
        for owner in owners:
            name = owner.removeprefix("@")
            if not (0 < len(name) <= 64 and all(c in _ACCOUNT for c in name)):
                raise ValueError(f"{where} has {owner[:40]!r}; give user names and @groups, such as"
                                 " \"alice\" or \"@serving\"")
        found[alias] = tuple(dict.fromkeys(owners))
    return found


def host_port(listen: object, where: str, example: str) -> None:
    host, _, port = listen.rpartition(":") if isinstance(listen, str) else ("", "", "")
    host = host.removeprefix("[").removesuffix("]")
    if not (host and host.isascii() and host.isprintable() and " " not in host
            and port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"{where} is {str(listen)[:40]!r}; give host:port, such as \"{example}\"")


def _power(settings: PowerSettings) -> None:
    def watts(value: float, what: str) -> None:
        if not 0 < value <= 5000:
            raise ValueError(f"[power] {what} is a number of watts, more than 0, not {repr(value)[:20]}")

    for index, value in settings.cards.items():
        if index < 0:
            raise ValueError(f"[power.cards] {str(index)[:20]!r} is not a card number")
        watts(value, f"cards.{index}")
    if not 0 <= settings.pause_s <= 60:
        raise ValueError(f"[power] pause_s is 0 to 60 seconds, not {repr(settings.pause_s)[:20]}")
    if settings.limit_w is not None:
        watts(settings.limit_w, "limit_w")


def _report(settings: ReportSettings) -> None:
    if not 0 <= settings.busy_util <= 100:
        raise ValueError(f"[report] busy_util is a percentage, 0 to 100, not {repr(settings.busy_util)[:20]}")


def _history(settings: HistorySettings) -> None:
    for key in ("sample_s", "raw_hours", "rollup_days"):
        value = getattr(settings, key)
        if value <= 0:
            raise ValueError(f"[history] {key} must be a number more than 0, not {repr(value)[:20]}")
    if settings.sample_s > 300:
        raise ValueError("[history] sample_s is at most 300 (one sample in each 5-minute rollup)")


NOTIFY_TYPES = ("wecom", "slack", "webhook")


def _notify(settings: NotifySettings) -> None:
    """[notify] and its [[notify.targets]]. Messages name a target by its name and type, never by its url."""
    names: set[str] = set()
    for target in settings.targets:
        where = f"[[notify.targets]] {target.name!r}"
        if target.type not in NOTIFY_TYPES:
            raise ValueError(f"{where}: type is {target.type[:20]!r}; use one of {', '.join(NOTIFY_TYPES)}")
        if bool(target.url) == (target.url_file is not None):
            raise ValueError(f"{where}: give url, or url_file (a file only the service reads), not both")
        if target.url and not _web_address(target.url):
            raise ValueError(f"{where}: url must be an http:// or https:// address")  # it is secret: not quoted
        if target.url_file is not None and not os.path.isabs(target.url_file):
            raise ValueError(f"{where}: url_file must be an absolute path")
        if target.name in names:
            raise ValueError(f"{where}: two targets have this name; give each its own name")
        names.add(target.name)
    for text in settings.summary_at:
        hours, colon, minutes = text.strip().partition(":")
        if not (colon and hours.isascii() and hours.isdigit() and minutes.isascii() and minutes.isdigit()
                and int(hours) < 24 and int(minutes) < 60 and len(minutes) == 2):
            raise ValueError(f"[notify] summary_at has {text[:20]!r}; give times of day such as \"09:00\"")
    for key in ("timeout_s", "max_attempts"):
        if getattr(settings, key) <= 0:
            raise ValueError(f"[notify] {key} must be a number more than 0")


def _alerts(settings: AlertSettings) -> None:
    for name in AlertSettings.__struct_fields__:
        if name in ("enabled", "quiet"):
            continue
        if (value := getattr(settings, name)) < 0:
            raise ValueError(f"[alerts] {name} must be a number, 0 or more, not {repr(value)[:20]}")
    if settings.quiet is not None:
        try:
            settings.quiet_minutes()
        except ValueError:
            raise ValueError(f"[alerts] quiet is {settings.quiet[:20]!r}; give local hours such as"
                             " \"22:00-08:00\"") from None


def _booking(settings: BookingSettings) -> None:
    night = settings.night_start
    hours, colon, minutes = night.strip().partition(":")
    digits = colon and (hours + minutes).isascii() and hours.isdigit() and minutes.isdigit() and len(minutes) == 2
    if not (digits and int(hours) < 24 and int(minutes) < 60):
        raise ValueError(f"[booking] night_start is {night[:20]!r}; give a time of day such as \"19:00\"")


def _fit(settings: FitSettings) -> None:
    if not 0 < settings.max_fill <= 1:
        raise ValueError(f"[fit] max_fill is {settings.max_fill}; give a share of the card from 0 to 1, such as 0.9")
    if settings.overhead_mib < 0 or (settings.card_mib is not None and settings.card_mib <= 0):
        raise ValueError("[fit] overhead_mib must be 0 or more, and card_mib more than 0")


def _metrics(settings: MetricsSettings) -> None:
    if settings.listen is not None:
        host_port(settings.listen, "[metrics] listen", "127.0.0.1:9400")


def _enforce(settings: EnforceSettings) -> None:
    if settings.run_jobs not in ("stop", "warn"):
        raise ValueError(f"[enforce] run_jobs is {settings.run_jobs!r}; use \"stop\" or \"warn\"")
    if settings.grace_s < 0:
        raise ValueError("[enforce] grace_s must be 0 or more seconds")
