"""Settings: one root-owned TOML file plus environment overrides, read into typed dataclasses.

Precedence for the database path: --db, then BOARD_DB, then [storage] db in the config
(BOARD_CONFIG, default /etc/board/board.toml), then /var/lib/board/board.db. A PostgreSQL store instead:
BOARD_DB_URL, then [storage] url (with an optional [storage] password_file).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from app.config_file import ConfigError, read_config

DEFAULT_DB_PATH = Path("/var/lib/board/board.db")
CLASSES = ("online", "batch", "finetune", "experiment")  # highest priority first


@dataclass(frozen=True, slots=True)
class ClassWindow:
    """A class is allowed in a pool only between `start` and `end` local time (wrapping midnight), and at weekends if set.
    app.core.policy alone decides what it allows."""

    start_minute: int
    end_minute: int
    weekends: bool = True


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    cards: tuple[int, ...]
    classes: tuple[str, ...] = CLASSES
    max_hours: float | None = None
    windows: dict[str, ClassWindow] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Policy:
    max_booking_hours: float = 72.0
    max_ahead_days: float = 30.0
    max_cards_per_user: int = 8
    timezone: str | None = None  # windows are evaluated here; default the system's (the service's, not a client's)


@dataclass(frozen=True, slots=True)
class LlamaSettings:
    server_bin: str | None = None
    port_min: int = 8100
    port_max: int = 8199
    host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ("127.0.0.1",)
    model_dirs: tuple[str, ...] = ()
    ready_timeout_s: float = 300.0
    log_dir: str | None = None  # default: beside the database, in servers/
    runner_user: str = "board-llama"  # the system user of `board runner`, which starts planned servers


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    """The shared install: members reach the service on this socket instead of opening the database."""

    socket: str | None = None
    group: str = "board"  # the members; the socket is 0660 to this group
    max_connections: int = 512  # at once, everyone's; lowered at start where the open-file limit is too low for it
    max_connections_per_uid: int = 64
    idle_timeout_s: float = 300.0  # a connection that sends no request for this long is closed


@dataclass(frozen=True, slots=True)
class EnforceSettings:
    grace_s: float = 60.0  # SIGTERM, then SIGKILL this long after, for jobs whose booking ended
    run_jobs: str = "stop"  # stop | warn
    interval_s: float = 5.0


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """`listen = "127.0.0.1:9400"`: the service serves Prometheus's /metrics there (app.service.box.metrics); unset: off."""

    listen: str | None = None

    @property
    def address(self) -> tuple[str, int]:
        """(host, port); an IPv6 host is written in brackets, "[::1]:9400"."""
        host, _, port = str(self.listen).rpartition(":")
        return host.removeprefix("[").removesuffix("]"), int(port)


@dataclass(frozen=True, slots=True)
class FitSettings:
    """Memory accounting (board fit, book --model, serve start's check)."""

    overhead_mib: float = 500.0  # per card: the CUDA context and libraries' workspaces on an RTX 5090
    max_fill: float = 0.90  # each card stays at or below this share of its memory
    card_mib: float | None = None  # a card's memory; default what the fleet reports (32607 for an RTX 5090)


@dataclass(frozen=True, slots=True)
class BookingSettings:
    """How booking words read: `tonight` starts at `night_start` (local time, HH:MM)."""

    night_start: str = "19:00"

    @property
    def night_start_minute(self) -> int:
        return _hhmm(self.night_start)


@dataclass(frozen=True, slots=True)
class HistorySettings:
    """What the service records of the cards (app.history): a sample every `sample_s`, raw for `raw_hours`,
    5-minute rollups for `rollup_days`. `db`: the history file; default beside the board's, <name>.history.db."""

    enabled: bool = True
    sample_s: float = 10.0
    raw_hours: float = 48.0
    rollup_days: float = 365.0
    db: str | None = None


@dataclass(frozen=True, slots=True)
class FleetSettings:
    """[fleet]: several hosts' services on one database (docs/configuration.md). `host`: this host's name in the
    fleet (default: the short hostname); a host whose heartbeat is older than `heartbeat_timeout_s` is HOST DOWN."""

    host: str = ""
    heartbeat_timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class ReportSettings:
    """`board report`: a card in IN USE counts as used only at a mean utilisation of `busy_util` % or more."""

    busy_util: float = 10.0


@dataclass(frozen=True, slots=True)
class NotifyTarget:
    """Where pushes go (app.notify). The url holds the secret (a robot key, a webhook path): never logged or shown.

    The config is readable by every member, so `url_file` may name a file only the service reads instead;
    it is read when a push is sent, never by the members' commands."""

    name: str
    type: str  # wecom | slack | webhook
    url: str = field(default="", repr=False)
    url_file: str | None = None

    def address(self) -> str:
        """The url; from `url_file` if that is where it is (raises OSError or ValueError when it can't be used)."""
        if not self.url_file:
            return self.url
        with open(self.url_file, encoding="utf-8") as file:
            url = file.read(4096).strip()
        if not _web_address(url):
            raise ValueError("its url_file does not hold an http:// or https:// address")
        return url


def _web_address(url: object) -> bool:
    from urllib.parse import urlsplit  # start-up: only a config with [[notify.targets]] parses urls

    try:
        parts = urlsplit(url) if isinstance(url, str) else None
        return parts is not None and parts.scheme in ("http", "https") and bool(parts.hostname) and "\n" not in url
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class NotifySettings:
    targets: tuple[NotifyTarget, ...] = ()
    summary_at: tuple[str, ...] = ("09:00",)  # local times (policy zone) of the board summary
    timeout_s: float = 5.0  # per HTTP request
    max_attempts: int = 8  # then the message is given up


@dataclass(frozen=True, slots=True)
class AlertSettings:
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


@dataclass(frozen=True, slots=True)
class GatewaySettings:
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
    team_aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The old names this config used (max_concurrent_per_key, now max_concurrent_per_user): the gateway says so at start.
    _renamed: tuple[str, ...] = ()
    # The door's limits (app.gateway.connections): a stranger's idle or slow connections cannot hold its files
    head_timeout_s: float = 10.0  # a request's head, from its connection's start or its first byte after an answer
    body_timeout_s: float = 60.0  # a request's body, once its head is read; then 408
    idle_timeout_s: float = 30.0  # a connection with no request in progress is closed after this
    max_connections: int = 4096  # at once, everyone's; lowered at start where the open-file limit is too low
    max_connections_per_address: int = 256  # from one client address (a proxy in front is one address: raise it)


@dataclass(frozen=True, slots=True)
class PowerSettings:
    """[power]: the limit every card should run at (the seeds cap 575 W cards at 500 W and lose about 5 % of decode
    speed), per-card overrides in [power.cards] ("3" = 450), and the pause between cards in `board power apply`
    (the seeds' staged power-on: one card at a time)."""

    limit_w: float | None = None
    cards: dict[int, float] = field(default_factory=dict)
    pause_s: float = 2.0

    def policy_w(self, index: int) -> float | None:
        return self.cards.get(index, self.limit_w)


@dataclass(frozen=True, slots=True)
class PostgresStore:
    """[storage] url: the board's store is this PostgreSQL database (a libpq URI), shared by every host's service.
    `password_file` holds the role's password (the reader's own file, mode 0600 or 0400); `host` names this host
    in the database's view (application_name) and in the one line an unreachable database gets."""

    url: str
    password_file: Path | None = None
    host: str = ""


@dataclass(frozen=True, slots=True)
class Config:
    path: Path | None = None  # the file it was read from, if any
    db_path: Path = DEFAULT_DB_PATH
    storage_url: str | None = None  # a PostgreSQL store ([storage] url, BOARD_DB_URL); None: SQLite at db_path
    storage_password_file: Path | None = None
    admin_group: str = "board-admin"
    refresh_seconds: float = 1.0
    hot_celsius: int = 90
    labels: dict[int, str] = field(default_factory=dict)
    policy: Policy = field(default_factory=Policy)
    pools: tuple[Pool, ...] = ()
    llama: LlamaSettings = field(default_factory=LlamaSettings)
    service: ServiceSettings = field(default_factory=ServiceSettings)
    enforce: EnforceSettings = field(default_factory=EnforceSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    fit: FitSettings = field(default_factory=FitSettings)
    booking: BookingSettings = field(default_factory=BookingSettings)
    history: HistorySettings = field(default_factory=HistorySettings)
    # [classes]: who may use a class (user names, @groups), for bookings and keys alike; a class not named: everyone.
    classes: dict[str, tuple[str, ...]] = field(default_factory=dict)

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
    notify: NotifySettings = field(default_factory=NotifySettings)
    alerts: AlertSettings = field(default_factory=AlertSettings)
    report: ReportSettings = field(default_factory=ReportSettings)
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    power: PowerSettings = field(default_factory=PowerSettings)
    fleet: FleetSettings = field(default_factory=FleetSettings)

    @property
    def fleet_host(self) -> str:
        """This host's name in the fleet: [fleet] host, else the short hostname."""
        return self.fleet.host or os.uname().nodename.split(".")[0] or "localhost"


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
    known = {"storage", "access", "display", "policy", "pools", "llama", "labels", "service", "enforce", "fit", "booking",
             "history", "metrics", "notify", "alerts", "report", "gateway", "power", "fleet", "classes"}
    if unknown := set(raw) - known:
        raise ValueError(f"unknown section(s) {', '.join(sorted(unknown))}")
    storage, access, display = raw.get("storage", {}), raw.get("access", {}), raw.get("display", {})
    policy = _build(Policy, raw.get("policy", {}), "[policy]")
    if policy.timezone:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # start-up: only a config that names a zone loads zoneinfo

        try:
            ZoneInfo(policy.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"[policy] timezone {policy.timezone!r} is not a known time zone,"
                             " such as 'Europe/Berlin'") from None
    pools = []
    for entry in raw.get("pools", []):
        entry = dict(entry)
        windows = {}
        for klass, window in entry.pop("windows", {}).items():
            if klass not in CLASSES:
                raise ValueError(f"pool {entry.get('name')!r}: unknown class {klass!r}")
            start, end = str(window["hours"]).split("-")
            windows[klass] = ClassWindow(_hhmm(start), _hhmm(end), bool(window.get("weekends", True)))
        classes = tuple(entry.pop("classes", CLASSES))
        if bad := [c for c in classes if c not in CLASSES]:
            raise ValueError(f"pool {entry.get('name')!r}: unknown class {bad[0]!r}")
        entry.update(cards=tuple(int(c) for c in entry["cards"]), classes=classes, windows=windows)
        pools.append(_build(Pool, entry, "[[pools]]"))
    llama = dict(raw.get("llama", {}))
    for key in ("allowed_hosts", "model_dirs"):
        if key in llama:
            llama[key] = tuple(llama[key])
    url, password_file = storage.get("url"), storage.get("password_file")
    if url is not None and (not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://"))):
        raise ValueError("[storage] url must be a PostgreSQL URI (postgresql://...)")
    if password_file is not None and not isinstance(password_file, str):
        raise ValueError("[storage] password_file must be a path")
    return Config(
        path=path,
        db_path=Path(storage.get("db", DEFAULT_DB_PATH)),
        storage_url=url or None,
        storage_password_file=Path(password_file).expanduser() if password_file else None,
        admin_group=str(access.get("admin_group", "board-admin")),
        refresh_seconds=float(display.get("refresh_seconds", 1.0)),
        hot_celsius=int(display.get("hot_celsius", 90)),
        labels={int(k): str(v) for k, v in raw.get("labels", {}).items()},
        policy=policy,
        pools=tuple(pools),
        llama=_build(LlamaSettings, llama, "[llama]"),
        service=_build(ServiceSettings, raw.get("service", {}), "[service]"),
        enforce=_enforce(raw.get("enforce", {})),
        metrics=_metrics(raw.get("metrics", {})),
        fit=_fit(raw.get("fit", {})),
        booking=_booking(raw.get("booking", {})),
        history=_history(raw.get("history", {})),
        notify=_notify(raw.get("notify", {})),
        alerts=_alerts(raw.get("alerts", {})),
        report=_report(raw.get("report", {})),
        gateway=_gateway(raw.get("gateway", {})),
        power=_power(raw.get("power", {})),
        fleet=_fleet(raw.get("fleet", {})),
        classes=_classes(raw.get("classes", {})),
    )


def _classes(table: dict) -> dict[str, tuple[str, ...]]:
    """[classes] online = ["@serving", "alice"]: a class named here is for those users and groups' members alone."""
    if not isinstance(table, dict):
        raise ValueError("[classes] is a table of class = [users and @groups], such as online = [\"@serving\"]")
    found = {}
    for klass, who in table.items():
        if klass not in CLASSES:
            raise ValueError(f"[classes] {str(klass)[:20]!r} is not a class; use one of {', '.join(CLASSES)}")
        if not isinstance(who, list) or not all(isinstance(w, str) and _account(w.removeprefix("@")) for w in who):
            raise ValueError(f"[classes] {klass} is {repr(who)[:40]}; give a list of user names and @groups,"
                             " such as [\"@serving\", \"alice\"]")
        found[klass] = tuple(who)
    return found


def _account(name: str) -> bool:
    """A user or group name as [classes] takes it: 1 to 64 printable characters, no space, '@' or ','."""
    return 0 < len(name) <= 64 and name.isprintable() and not any(c in name for c in " @,")


_HOST_NAME = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"


def _fleet(table: dict) -> FleetSettings:
    settings = _build(FleetSettings, table, "[fleet]")
    host = settings.host
    # A host name is typed in card specs (gpu2:0-3): letters, digits, '-' and '_', never a ':' or a space.
    if not isinstance(host, str) or len(host) > 63 or any(c not in _HOST_NAME for c in host):
        raise ValueError(f"[fleet] host must be a short host name (letters, digits, '-', '_'), not {repr(host)[:40]}")
    value = settings.heartbeat_timeout_s
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 30:
        raise ValueError(f"[fleet] heartbeat_timeout_s must be more than 0 and at most 30, not {repr(value)[:20]}")
    return settings


def _gateway(table: dict) -> GatewaySettings:
    table, renamed = dict(table), ()
    if "max_concurrent_per_key" in table:  # its old name: a config written for per-key limits still loads
        if "max_concurrent_per_user" in table:
            raise ValueError("[gateway] max_concurrent_per_key is the old name of max_concurrent_per_user (now counted"
                             " across all of a member's keys); keep only max_concurrent_per_user")
        table["max_concurrent_per_user"], renamed = table.pop("max_concurrent_per_key"), ("max_concurrent_per_key",)
    settings = replace(_build(GatewaySettings, table, "[gateway]"), _renamed=renamed)
    host_port(settings.listen, "[gateway] listen", "0.0.0.0:8080")
    if not isinstance(settings.user, str) or not settings.user:
        raise ValueError("[gateway] user is the gateway's account name, such as \"board-gateway\"")
    if not isinstance(settings.log_bodies, bool):
        raise ValueError("[gateway] log_bodies must be true or false")
    positive = ("max_body_mb", "max_concurrent_per_user", "max_keys_per_user", "head_timeout_s", "body_timeout_s",
                "idle_timeout_s", "max_connections", "max_connections_per_address")
    for key in ("drain_s", "queue_timeout_s", *positive):
        value = getattr(settings, key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or (
                key in positive and value <= 0):
            raise ValueError(f"[gateway] {key} must be a number more than 0, not {repr(value)[:20]}")
    whole = ("max_concurrent_per_user", "max_keys_per_user", "max_connections", "max_connections_per_address")
    for key in whole:
        if getattr(settings, key) != int(getattr(settings, key)):
            raise ValueError(f"[gateway] {key} must be a whole number, not {getattr(settings, key)!r}")
    return replace(settings, **{key: int(getattr(settings, key)) for key in whole},
                   team_aliases=_team_aliases(settings.team_aliases))


_ACCOUNT = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_."


def _team_aliases(table: object) -> dict[str, tuple[str, ...]]:
    """[gateway.team_aliases]: alias = a list of user names and "@group"s, at least one."""
    example = '[gateway.team_aliases] team-llm = ["alice", "@serving"]'
    if not isinstance(table, dict):
        raise ValueError(f"[gateway] team_aliases is a table of alias = who may serve it, such as {example}")
    found = {}
    for alias, owners in table.items():
        where = f"[gateway.team_aliases] {alias[:40]!r}"
        if not (0 < len(alias) <= 200 and alias.isprintable()):
            raise ValueError(f"{where}: an alias is 1 to 200 printable characters")
        if not isinstance(owners, list) or not owners:
            raise ValueError(f"{where} is a list of users and @groups who may serve it, such as {example}")
        for owner in owners:
            name = owner.removeprefix("@") if isinstance(owner, str) else ""
            if not (0 < len(name) <= 64 and all(c in _ACCOUNT for c in name)):
                raise ValueError(f"{where} has {str(owner)[:40]!r}; give user names and @groups, such as"
                                 " \"alice\" or \"@serving\"")
        found[alias] = tuple(dict.fromkeys(owners))
    return found


def host_port(listen: object, where: str, example: str) -> None:
    host, _, port = listen.rpartition(":") if isinstance(listen, str) else ("", "", "")
    host = host.removeprefix("[").removesuffix("]")
    if not (host and host.isascii() and host.isprintable() and " " not in host
            and port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"{where} is {str(listen)[:40]!r}; give host:port, such as \"{example}\"")


def _power(table: dict) -> PowerSettings:
    settings = _build(PowerSettings, table, "[power]")

    def watts(value, what: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 5000:
            raise ValueError(f"[power] {what} is a number of watts, more than 0, not {repr(value)[:20]}")
        return float(value)

    cards = {}
    if not isinstance(settings.cards, dict):
        raise ValueError("[power] cards is a table of card = watts, such as [power.cards] 3 = 450")
    for key, value in settings.cards.items():
        if not str(key).isdigit():
            raise ValueError(f"[power.cards] {str(key)[:20]!r} is not a card number")
        cards[int(key)] = watts(value, f"cards.{key}")
    pause = settings.pause_s
    if isinstance(pause, bool) or not isinstance(pause, int | float) or not 0 <= pause <= 60:
        raise ValueError(f"[power] pause_s is 0 to 60 seconds, not {repr(pause)[:20]}")
    limit = None if settings.limit_w is None else watts(settings.limit_w, "limit_w")
    return PowerSettings(limit_w=limit, cards=cards, pause_s=float(pause))


def _report(table: dict) -> ReportSettings:
    settings = _build(ReportSettings, table, "[report]")
    value = settings.busy_util
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 100:
        raise ValueError(f"[report] busy_util is a percentage, 0 to 100, not {repr(value)[:20]}")
    return settings


def _history(table: dict) -> HistorySettings:
    settings = _build(HistorySettings, table, "[history]")
    if not isinstance(settings.enabled, bool):
        raise ValueError("[history] enabled must be true or false")
    for key in ("sample_s", "raw_hours", "rollup_days"):
        value = getattr(settings, key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError(f"[history] {key} must be a number more than 0, not {repr(value)[:20]}")
    if settings.sample_s > 300:
        raise ValueError("[history] sample_s is at most 300 (one sample in each 5-minute rollup)")
    if settings.db is not None and not isinstance(settings.db, str):
        raise ValueError("[history] db must be a path")
    return settings


NOTIFY_TYPES = ("wecom", "slack", "webhook")


def _notify(table: dict) -> NotifySettings:
    """[notify] and its [[notify.targets]]. Messages name a target by its name and type, never by its url."""
    table = dict(table)
    targets = []
    for number, entry in enumerate(table.pop("targets", []), 1):
        entry = dict(entry)
        kind = entry.get("type")
        name = str(entry.get("name") or (kind if isinstance(kind, str) else f"target {number}"))
        where = f"[[notify.targets]] {name!r}"
        if unknown := sorted(set(entry) - {"name", "type", "url", "url_file"}):
            raise ValueError(f"unknown key {unknown[0][:40]!r} in {where}; known keys: name, type, url, url_file")
        if kind not in NOTIFY_TYPES:
            raise ValueError(f"{where}: type is {str(kind)[:20]!r}; use one of {', '.join(NOTIFY_TYPES)}")
        url, url_file = entry.get("url"), entry.get("url_file")
        if (url is None) == (url_file is None):
            raise ValueError(f"{where}: give url, or url_file (a file only the service reads), not both")
        if url is not None and not _web_address(url):
            raise ValueError(f"{where}: url must be an http:// or https:// address")  # it is secret: not quoted
        if url_file is not None and not (isinstance(url_file, str) and os.path.isabs(url_file)):
            raise ValueError(f"{where}: url_file must be an absolute path")
        if any(t.name == name for t in targets):
            raise ValueError(f"{where}: two targets have this name; give each its own name")
        targets.append(NotifyTarget(name, kind, url or "", url_file))
    settings = _build(NotifySettings, table, "[notify]")
    at = settings.summary_at
    if not isinstance(at, list | tuple) or not all(isinstance(t, str) for t in at):
        raise ValueError("[notify] summary_at is a list of times of day such as [\"09:00\"]")
    for text in at:
        hours, colon, minutes = text.strip().partition(":")
        if not (colon and hours.isascii() and hours.isdigit() and minutes.isascii() and minutes.isdigit()
                and int(hours) < 24 and int(minutes) < 60 and len(minutes) == 2):
            raise ValueError(f"[notify] summary_at has {text[:20]!r}; give times of day such as \"09:00\"")
    for key in ("timeout_s", "max_attempts"):
        value = getattr(settings, key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError(f"[notify] {key} must be a number more than 0")
    return replace(settings, targets=tuple(targets), summary_at=tuple(at), max_attempts=int(settings.max_attempts))


def _alerts(table: dict) -> AlertSettings:
    settings = _build(AlertSettings, table, "[alerts]")
    if not isinstance(settings.enabled, bool):
        raise ValueError("[alerts] enabled must be true or false")
    for f in fields(AlertSettings):
        value = getattr(settings, f.name)
        if f.name in ("enabled", "quiet"):
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"[alerts] {f.name} must be a number, 0 or more, not {repr(value)[:20]}")
    if settings.quiet is not None:
        try:
            settings.quiet_minutes()
        except (AttributeError, ValueError):
            raise ValueError(f"[alerts] quiet is {str(settings.quiet)[:20]!r}; give local hours such as"
                             " \"22:00-08:00\"") from None
    return settings


def _booking(table: dict) -> BookingSettings:
    settings = _build(BookingSettings, table, "[booking]")
    night = settings.night_start
    hours, colon, minutes = night.strip().partition(":") if isinstance(night, str) else ("", "", "")
    digits = colon and (hours + minutes).isascii() and hours.isdigit() and minutes.isdigit() and len(minutes) == 2
    if not (digits and int(hours) < 24 and int(minutes) < 60):
        raise ValueError(f"[booking] night_start is {str(night)[:20]!r}; give a time of day such as \"19:00\"")
    return settings


def _fit(table: dict) -> FitSettings:
    settings = _build(FitSettings, table, "[fit]")
    for key, value in table.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"[fit] {key} must be a number, not {str(value)[:20]!r}")
    if not 0 < settings.max_fill <= 1:
        raise ValueError(f"[fit] max_fill is {settings.max_fill}; give a share of the card from 0 to 1, such as 0.9")
    if settings.overhead_mib < 0 or (settings.card_mib is not None and settings.card_mib <= 0):
        raise ValueError("[fit] overhead_mib must be 0 or more, and card_mib more than 0")
    return settings


def _metrics(table: dict) -> MetricsSettings:
    settings = _build(MetricsSettings, table, "[metrics]")
    if settings.listen is not None:
        host_port(settings.listen, "[metrics] listen", "127.0.0.1:9400")
    return settings


def _enforce(table: dict) -> EnforceSettings:
    settings = _build(EnforceSettings, table, "[enforce]")
    if settings.run_jobs not in ("stop", "warn"):
        raise ValueError(f"[enforce] run_jobs is {settings.run_jobs!r}; use \"stop\" or \"warn\"")
    if settings.grace_s < 0:
        raise ValueError("[enforce] grace_s must be 0 or more seconds")
    return settings


def _build(cls, table: dict, section: str):
    names = {f.name for f in fields(cls) if not f.name.startswith("_")}  # _fields are the loader's, never the file's
    if unknown := sorted(set(table) - names):
        raise ValueError(f"unknown key {unknown[0]!r} in {section}; known keys: {', '.join(sorted(names))}")
    return cls(**table)
