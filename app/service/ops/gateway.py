"""The gateway's operations: keys (key_new, key_list, key_revoke), what the gateway routes by (gateway_state),
its accounting (gateway_usage, and usage for people).

A member issues their own keys: the service knows who asks from the kernel (SO_PEERCRED), so no master key is
needed; admins may issue keys for other accounts (service accounts). Only a key's hash and fingerprint are kept.
A key is for one project (--project, else the holder's only one; an admin's key for an account is that account's),
and its requests count against that project's limits (app.gateway.limits). Its class is one its holder may use
([classes]) and its project may use ([[projects]] classes), and a member holds at most [gateway] max_keys_per_user
live keys they issued themselves; keys an admin issues for an account are apart (the admin chose to, and it is
audited).
gateway_state and gateway_usage answer only the gateway's account ([gateway] user) or root: gateway_state
carries every server's API key and every key's hash.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, NoReturn, NotRequired, TypedDict

import msgspec

from app.config import CLASSES
from app.core.identity import listed
from app.core.identity import Identity
from app.core.keys import fingerprint, key_hash, new_key
from app.core import projects
from app.core.policy import class_refusal, may_use, policy_zone
from app.errors import BadInput, Conflict, NotPermitted
from app.service.ops.registry import ById, Int, Request, Time, op
from app.service.rules.audit import audit
from app.store import bookings as booking_rows
from app.store import keys as rows
from app.store.db import write

if TYPE_CHECKING:
    from app.service import Service

MAX_BATCH = 1000  # accounting records per gateway_usage call


def changed(service: Service) -> None:
    """Keys, servers or bookings changed: the gateway re-reads gateway_state (the hub's `gateway` kind)."""
    service.hub.changed("gateway")


def _gateway_only(service: Service, me: Identity, what: str) -> None:
    if me.uid != 0 and me.name != service.config.gateway.user:
        raise NotPermitted(f"{what} is the gateway's own operation (account {service.config.gateway.user})")


# A key as its holder sees it (functional form: `class` is a keyword); never its hash. "project" only where it is
# not the implicit one: a board without projects keeps its old shape.
KeyWire = TypedDict("KeyWire", {
    "id": int, "name": str, "user": str, "fingerprint": str, "models": list[str] | None, "class": str | None,
    "created": int, "expires": int | None, "revoked": int | None, "project": NotRequired[str]})


def _public(key: dict[str, Any]) -> KeyWire:
    wire: KeyWire = {"id": key["id"], "name": key["name"], "user": key["user"], "fingerprint": key["fingerprint"],
                     "models": key["models"], "class": key["class"], "created": key["created"],
                     "expires": key["expires"], "revoked": key["revoked"]}
    if key["project"]:
        wire["project"] = key["project"]
    return wire


def _refuse(service: Service, me: Identity, holder: str, why: str) -> NoReturn:
    """A key refused by rule ([classes], the cap): audited, then exit 4."""
    audit(service, me, "key_new", None, ok=False, details={"user": holder[:64], "why": why})
    raise NotPermitted(why)


class KeyNew(Request, frozen=True):
    name: str = ""  # at most 100 printable characters
    models: list[str] | None = None  # the aliases it may use; None: any
    klass: str | None = None  # None: the usual class of the holder's bookings, else batch, else the lowest they may use
    expires: Time | None = None
    user: str | None = None  # the holder, for admins; None: the caller
    project: str | None = None  # the project it is for ([[projects]]); None: the holder's only one


# The new key, the key itself in this reply and nowhere else (functional form: `class` is a keyword); "project" as
# in KeyWire.
NewKey = TypedDict("NewKey", {
    "id": int, "name": str, "key": str, "user": str, "models": list[str] | None, "class": str, "expires": int | None,
    "fingerprint": str, "project": NotRequired[str]})


@op("key_new", KeyNew)
def key_new(service: Service, me: Identity, request: KeyNew) -> NewKey:
    """A new key for `me` (or, for admins, for `user`); the key itself is in this reply and nowhere else."""
    name, models, klass, expires, user = request.name, request.models, request.klass, request.expires, request.user
    if klass is not None and klass not in CLASSES:
        raise BadInput(f"class {klass[:20]!r}: use one of {', '.join(CLASSES)}")
    if models is not None and (not models or not all(0 < len(m) <= 200 and m.isprintable() for m in models)):
        raise BadInput("models is a list of model aliases, such as [\"team-llm\"]")
    if len(name) > 100 or not name.isprintable():
        raise BadInput("a key's name is at most 100 printable characters")
    now = int(service.clock())
    if expires is not None and expires <= now:
        raise BadInput("the key would expire before it is made; give a time in the future")
    holder, uid = me.name, me.uid
    if user is not None and user != me.name:
        if not me.is_admin:
            audit(service, me, "key_new", None, ok=False, details={"user": user[:64], "why": "not an admin"})
            raise NotPermitted(f"only admins (group {service.config.admin_group}) issue keys for other accounts")
        found = service.lookup_user(user)
        if found is None:
            raise BadInput(f"no account named {user[:40]!r}")
        holder, uid = found
    config = service.config
    try:  # the holder's project: an admin's key for an account is that account's
        project = projects.choose(config, holder, request.project)
    except NotPermitted as error:
        _refuse(service, me, holder, str(error))
    if klass is None:  # the usual class of their bookings, else batch, else the lowest the holder and project may use
        usual = rows.usual_class(service.conn, uid)
        chosen = next((k for k in (usual, "batch", *reversed(CLASSES)) if k in CLASSES and may_use(config, k, holder)
                       and projects.class_refusal(config, project, k) is None), None)
        if chosen is None:
            rules = f"[classes], project {project}'s classes" if project else "[classes]"
            _refuse(service, me, holder, f"{holder} may use no class ({rules} in the service's config); ask an admin")
        klass = chosen
    elif reason := class_refusal(config, klass, holder) or projects.class_refusal(config, project, klass):
        _refuse(service, me, holder, reason)
    key = new_key()
    hashed = key_hash(key)
    held = None
    with write(service.conn):  # counted in the transaction that adds it: two at once cannot both pass the cap
        # The cap is on the keys members issue themselves; those an admin issues for an account (--user) are apart.
        if uid == me.uid and (held := rows.issued_by_self(service.conn, uid, now)) >= config.gateway.max_keys_per_user:
            key_id = None
        else:
            key_id = rows.insert(service.conn, name=name, user=holder, uid=uid, hashed=hashed,
                                 fingerprint=fingerprint(hashed), models=models, klass=klass, now=now,
                                 created_by=me.uid, expires_at=expires, project=project)
    if key_id is None:
        _refuse(service, me, holder, f"{holder} has {held} live keys, the most a member may hold ([gateway]"
                                     " max_keys_per_user); revoke one first (board key list, board key revoke ID)")
    audit(service, me, "key_new", None, ok=True, details={
        "key": key_id, "fingerprint": fingerprint(hashed), "user": holder, "class": klass,
        **({"project": project} if project else {})})
    changed(service)
    made: NewKey = {"id": key_id, "name": name, "key": key, "user": holder, "models": models, "class": klass,
                    "expires": expires, "fingerprint": fingerprint(hashed)}
    if project:
        made["project"] = project
    return made


class KeyList(Request, frozen=True):
    all: bool = False  # the revoked and expired ones too, and for admins everyone's


@op("key_list", KeyList)
def key_list(service: Service, me: Identity, request: KeyList) -> list[KeyWire]:
    """Your usable keys; with `all` also the revoked and expired ones, and for admins everyone's."""
    every = request.all
    uid = None if every and me.is_admin else me.uid
    return [_public(k) for k in rows.listing(service.conn, uid=uid, live_at=None if every else int(service.clock()))]


@op("key_revoke", ById)
def key_revoke(service: Service, me: Identity, request: ById) -> KeyWire:
    id = request.id
    key = rows.get(service.conn, id)
    if key is None or (key["uid"] != me.uid and not me.is_admin):
        raise BadInput(f"no key {id} of yours; see board key list")
    if key["revoked"] is not None:
        raise Conflict(f"key {id} was already revoked")
    with write(service.conn):
        rows.revoke(service.conn, id, int(service.clock()))
    audit(service, me, "key_revoke", None, ok=True, details={"key": id, "fingerprint": key["fingerprint"],
                                                              "user": key["user"]})
    changed(service)
    revoked = rows.get(service.conn, id)
    assert revoked is not None  # a key is never deleted
    return _public(revoked)


# -- the gateway's own operations -----------------------------------------------------------------

class RoutedServer(TypedDict):
    """A live server as the gateway routes to it (app.gateway.routing)."""
    id: int
    alias: str
    api_key: str | None  # the server's own key, which the gateway sends it
    url: str
    parallel: int
    user: str
    booking: int
    booking_end: int | None
    cards: list[int]
    state: str
    host: str
    on_demand: str  # the catalog alias its booking was made for ([[models]]); "" for a member's server


# A usable key as the gateway checks it: its hash, never the key (functional form: `class` is a keyword). Its class
# is None where its holder may no longer use it; its project is the one whose limits its requests count against.
RoutedKey = TypedDict("RoutedKey", {
    "id": int, "hash": str, "user": str, "models": list[str] | None, "class": str | None, "expires": int | None,
    "revoked": int | None, "fingerprint": str, "project": str})


class TeamAlias(TypedDict):
    owners: list[str]  # [gateway.team_aliases]: who may serve it
    holders: list[str]  # the owners whose live servers serve it now


class GatewayState(TypedDict):
    now: int
    servers: list[RoutedServer]
    planned: list[dict[str, Any]]  # app.store.plans.planned_servers: alias, booking, start, end, user
    keys: list[RoutedKey]
    team_aliases: dict[str, TeamAlias]
    # Each project's tokens through the gateway since `since`, the policy zone's last midnight (recorded ones: the
    # gateway adds what it counted since, app.gateway.limits). Empty on a board without projects.
    tokens_today: TokensToday
    # Asked for (fair_use), on a board with projects: each project's recorded tokens decayed to `now` by [policy]
    # fair_share_half_life_days, hour by hour; a gateway that starts seeds its fair order with them.
    fair_use: NotRequired[dict[str, float]]


class GatewayStateAsk(Request, frozen=True):
    fair_use: bool = False  # the gateway asks once, as it starts: a read over the lookback, not for each change


class TokensToday(TypedDict):
    since: int
    projects: dict[str, int]


@op("gateway_state", GatewayStateAsk)
def gateway_state(service: Service, me: Identity, request: GatewayStateAsk) -> GatewayState:
    """What the gateway routes by: the live servers (with their API keys), the planned ones, the usable keys."""
    _gateway_only(service, me, "gateway_state")
    from app.llama import rows as servers  # start-up: llama's modules load only for servers
    from app.store import bookings
    from app.store.plans import planned_servers

    now = int(service.clock())
    conn = service.conn
    api_keys = dict(conn.execute("SELECT id, api_key FROM servers WHERE state IN ('starting', 'ready', 'stopping')"))
    found: list[RoutedServer] = []
    for server in servers.live(conn):
        booking = bookings.get(conn, server.booking_id)
        host = "127.0.0.1" if server.host in ("0.0.0.0", "", "127.0.0.1", "localhost") else server.host
        found.append({
            "id": server.id, "alias": server.alias or server.model.rsplit("/", 1)[-1], "api_key": api_keys.get(server.id),
            "url": f"http://{f'[{host}]' if ':' in host else host}:{server.port}", "parallel": server.parallel or 1,
            "user": server.user, "booking": server.booking_id, "booking_end": booking.end if booking else None,
            "cards": list(server.cards), "state": server.state, "host": "local",
            "on_demand": booking.on_demand if booking else ""})
    # A key made before [classes] kept its class from its holder waits after every class (None ranks last).
    keys: list[RoutedKey] = [{"id": k["id"], "hash": k["hash"], "user": k["user"], "models": k["models"],
                              "class": k["class"] if may_use(service.config, k["class"], k["user"]) else None,
                              "expires": k["expires"], "revoked": k["revoked"], "fingerprint": k["fingerprint"],
                              "project": k["project"]}
                             for k in rows.listing(conn, live_at=now)]
    # The team aliases ([gateway.team_aliases]), each with its live servers' holders who may serve it: the router
    # routes such an alias to those holders' servers only, and any other alias to one holder's (routing.Router).
    teams: dict[str, TeamAlias] = {
        alias: {"owners": list(owners), "holders": sorted({s["user"] for s in found if s["alias"] == alias
                                                           and listed(owners, s["user"])})}
        for alias, owners in service.config.gateway.team_aliases.items()}
    since = projects.day(now, policy_zone(service.config))[0]
    spent = rows.tokens_by_project(conn, since) if service.config.projects else {}
    state: GatewayState = {"now": now, "servers": found, "planned": planned_servers(conn, now), "keys": keys,
                           "team_aliases": teams, "tokens_today": {"since": since, "projects": spent}}
    if request.fair_use and service.config.projects:
        state["fair_use"] = fair_use(service, now)
    return state


def fair_use(service: Service, now: int) -> dict[str, float]:
    """Each project's recorded gateway tokens, each hour's decayed from its middle to `now` (fair share's use)."""
    from app.core import fairshare  # start-up: only a gateway that starts asks

    half_life = service.config.policy.fair_share_half_life_days * 86400
    found: dict[str, float] = {}
    for project, hour, tokens in rows.tokens_by_project_hour(service.conn, fairshare.lookback(service.config, now)):
        found[project] = found.get(project, 0.0) + tokens * 0.5 ** (max(0, now - hour - 1800) / half_life)
    return found


Count = Annotated[int, msgspec.Meta(ge=0, le=2**53 - 1)]  # a JSON number every reader takes whole


class UsageRecord(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One request the gateway answered, as it reports it (app.store.keys.USAGE_FIELDS)."""
    ts: Count
    status: Count
    prompt_tokens: Count
    completion_tokens: Count
    duration_ms: Count
    key_id: Int | None = None
    server_id: Int | None = None
    ttft_ms: Int | None = None
    fingerprint: str | None = None
    user: str | None = None
    model: str | None = None
    request: str | None = None  # the gateway's id for the record, so that a batch sent twice is recorded once
    project: str = ""  # the key's project ("" on a board without projects)


class GatewayUsage(Request, frozen=True):
    records: Annotated[list[UsageRecord], msgspec.Meta(max_length=MAX_BATCH, description=f"at most {MAX_BATCH} records at once")]


class Recorded(TypedDict):
    recorded: int


@op("gateway_usage", GatewayUsage)
def gateway_usage(service: Service, me: Identity, request: GatewayUsage) -> Recorded:
    """A batch of accounting records from the gateway (app.store.keys.USAGE_FIELDS)."""
    _gateway_only(service, me, "gateway_usage")
    clean = []
    for record in request.records:
        if record.request is not None and not (0 < len(record.request) <= 64 and record.request.isascii()
                                               and record.request.isprintable()):
            raise BadInput("gateway_usage: request is the gateway's id for the record, at most 64 printable characters")
        row = {f: getattr(record, f) for f in rows.USAGE_FIELDS}
        for f in ("fingerprint", "user", "model", "project"):
            row[f] = (row[f] or "")[:200]
        clean.append(row)
    with write(service.conn):
        rows.record_usage(service.conn, clean)
    return {"recorded": len(clean)}


class Usage(Request, frozen=True):
    since: Time = 0
    by: str = "user"  # user, key, model, or project on a board with [[projects]]


class UsageReply(TypedDict):
    since: int
    by: str
    rows: list[rows.UsageRow]
    # By user or project: what their bookings' cards drew in the same time (app.history.energy).
    energy: NotRequired[list[dict]]


@op("usage", Usage)
def usage(service: Service, me: Identity, request: Usage) -> UsageReply:
    """The gateway's requests and tokens since `since`, summed by user, key, model or project (everyone's, like
    report)."""
    since, by = request.since, request.by
    if by == "project" and not service.config.projects:
        raise BadInput("this board has no projects ([[projects]]), so usage is not kept by project; use --by user,"
                       " key or model")
    if by not in ("user", "key", "model", "project"):
        raise BadInput(f"by {by[:20]!r}: use user, key, model or project")
    found: UsageReply = {"since": since, "by": by, "rows": rows.usage(service.conn, since, by)}
    if by in ("user", "project"):
        from app.history.energy import energy_rows  # start-up: only usage by user or project reads the history

        now = int(service.clock())
        found["energy"] = energy_rows(service.history, booking_rows.live_between(service.conn, since, now), since, now,
                                      by)
    return found
