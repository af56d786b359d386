"""The gateway's operations: keys (key_new, key_list, key_revoke), what the gateway routes by (gateway_state),
its accounting (gateway_usage, and usage for people).

A member issues their own keys: the service knows who asks from the kernel (SO_PEERCRED), so no master key is
needed; admins may issue keys for other accounts (service accounts). Only a key's hash and fingerprint are kept.
A key's class is one its holder may use ([classes]), and a member holds at most [gateway] max_keys_per_user live
keys they issued themselves; keys an admin issues for an account are apart (the admin chose to, and it is audited).
gateway_state and gateway_usage answer only the gateway's account ([gateway] user) or root: gateway_state
carries every server's API key and every key's hash.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.config import CLASSES
from app.core.identity import listed
from app.core.identity import Identity
from app.core.keys import fingerprint, key_hash, new_key
from app.core.policy import class_refusal, may_use
from app.errors import BadInput, Conflict, NotPermitted
from app.service.rules.audit import audit
from app.service.ops.registry import BOOL, LIST, STR, TIME, op
from app.store import keys as rows
from app.store.db import write

if TYPE_CHECKING:
    from app.service import Service

MAX_BATCH = 1000  # accounting records per gateway_usage call
_USAGE_INTS = ("ts", "status", "prompt_tokens", "completion_tokens", "duration_ms")


def changed(service: Service) -> None:
    """Keys, servers or bookings changed: the gateway re-reads gateway_state (the hub's `gateway` kind)."""
    service.hub.changed("gateway")


def _gateway_only(service: Service, me: Identity, what: str) -> None:
    if me.uid != 0 and me.name != service.config.gateway.user:
        raise NotPermitted(f"{what} is the gateway's own operation (account {service.config.gateway.user})")


def _public(key: dict) -> dict:
    return {k: key[k] for k in ("id", "name", "user", "fingerprint", "models", "class", "created", "expires",
                                "revoked")}


def _refuse(service: Service, me: Identity, holder: str, why: str) -> None:
    """A key refused by rule ([classes], the cap): audited, then exit 4."""
    audit(service, me, "key_new", None, ok=False, details={"user": holder[:64], "why": why})
    raise NotPermitted(why)


@op("key_new", {}, {"name": STR, "models": LIST, "class": STR, "expires": TIME, "user": STR})
def key_new(service: Service, me: Identity, name: str = "", models=None, expires=None, user=None, **rest) -> dict:
    """A new key for `me` (or, for admins, for `user`); the key itself is in this reply and nowhere else."""
    klass = rest.get("class")
    if klass is not None and klass not in CLASSES:
        raise BadInput(f"class {klass[:20]!r}: use one of {', '.join(CLASSES)}")
    if models is not None and (not models or not all(isinstance(m, str) and 0 < len(m) <= 200 and m.isprintable()
                                                     for m in models)):
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
    if klass is None:  # the usual class of their bookings, else batch, else the lowest the holder may use
        usual = rows.usual_class(service.conn, uid)
        klass = next((k for k in (usual, "batch", *reversed(CLASSES)) if k in CLASSES and may_use(config, k, holder)),
                     None)
        if klass is None:
            _refuse(service, me, holder, f"{holder} may use no class ([classes] in the service's config); ask an admin")
    elif reason := class_refusal(config, klass, holder):
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
                                 created_by=me.uid, expires_at=expires)
    if key_id is None:
        _refuse(service, me, holder, f"{holder} has {held} live keys, the most a member may hold ([gateway]"
                                     " max_keys_per_user); revoke one first (board key list, board key revoke ID)")
    audit(service, me, "key_new", None, ok=True,
          details={"key": key_id, "fingerprint": fingerprint(hashed), "user": holder, "class": klass})
    changed(service)
    return {"id": key_id, "name": name, "key": key, "user": holder, "models": models, "class": klass,
            "expires": expires, "fingerprint": fingerprint(hashed)}


@op("key_list", {}, {"all": BOOL})
def key_list(service: Service, me: Identity, all: bool = False) -> list:
    """Your usable keys; with `all` also the revoked and expired ones, and for admins everyone's."""
    uid = None if all and me.is_admin else me.uid
    return [_public(k) for k in rows.listing(service.conn, uid=uid, live_at=None if all else int(service.clock()))]


@op("key_revoke", {"id": int})
def key_revoke(service: Service, me: Identity, id: int) -> dict:
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
    return _public(rows.get(service.conn, id))


@op("gateway_state", {})
def gateway_state(service: Service, me: Identity) -> dict:
    """What the gateway routes by: the live servers (with their API keys), the planned ones, the usable keys."""
    _gateway_only(service, me, "gateway_state")
    from app.llama import rows as servers  # start-up: llama's modules load only for servers
    from app.store import bookings
    from app.store.plans import planned_servers

    now = int(service.clock())
    conn = service.conn
    api_keys = dict(conn.execute("SELECT id, api_key FROM servers WHERE state IN ('starting', 'ready', 'stopping')"))
    found = []
    for server in servers.live(conn):
        booking = bookings.get(conn, server.booking_id)
        host = "127.0.0.1" if server.host in ("0.0.0.0", "", "127.0.0.1", "localhost") else server.host
        found.append({
            "id": server.id, "alias": server.alias or server.model.rsplit("/", 1)[-1], "api_key": api_keys.get(server.id),
            "url": f"http://{f'[{host}]' if ':' in host else host}:{server.port}", "parallel": server.parallel or 1,
            "user": server.user, "booking": server.booking_id, "booking_end": booking.end if booking else None,
            "cards": list(server.cards), "state": server.state, "host": "local"})
    # A key made before [classes] kept its class from its holder waits after every class (None ranks last).
    keys = [{"id": k["id"], "hash": k["hash"], "user": k["user"], "models": k["models"],
             "class": k["class"] if may_use(service.config, k["class"], k["user"]) else None,
             "expires": k["expires"], "revoked": k["revoked"], "fingerprint": k["fingerprint"]}
            for k in rows.listing(conn, live_at=now)]
    # The team aliases ([gateway.team_aliases]), each with its live servers' holders who may serve it: the router
    # routes such an alias to those holders' servers only, and any other alias to one holder's (routing.Router).
    teams = {alias: {"owners": list(owners), "holders": sorted({s["user"] for s in found if s["alias"] == alias
                                                                 and listed(owners, s["user"])})}
             for alias, owners in service.config.gateway.team_aliases.items()}
    return {"now": now, "servers": found, "planned": planned_servers(conn, now), "keys": keys, "team_aliases": teams}


@op("gateway_usage", {"records": LIST})
def gateway_usage(service: Service, me: Identity, records: list) -> dict:
    """A batch of accounting records from the gateway (app.store.keys.USAGE_FIELDS)."""
    _gateway_only(service, me, "gateway_usage")
    if len(records) > MAX_BATCH:
        raise BadInput(f"gateway_usage: at most {MAX_BATCH} records at once")
    clean = []
    for record in records:
        if not isinstance(record, dict):
            raise BadInput("gateway_usage: each record is an object")
        row = {f: record.get(f) for f in rows.USAGE_FIELDS}
        for f in _USAGE_INTS:
            if not isinstance(row[f], int) or isinstance(row[f], bool) or not 0 <= row[f] < 2**53:
                raise BadInput(f"gateway_usage: {f} must be a whole number")
        for f in ("fingerprint", "user", "model"):
            row[f] = str(row[f] or "")[:200]
        for f in ("key_id", "server_id", "ttft_ms"):
            if not isinstance(row[f], int) or isinstance(row[f], bool):
                row[f] = None
        if row["request"] is not None and not (isinstance(row["request"], str) and 0 < len(row["request"]) <= 64
                                               and row["request"].isascii() and row["request"].isprintable()):
            raise BadInput("gateway_usage: request is the gateway's id for the record, at most 64 printable characters")
        clean.append(row)
    with write(service.conn):
        rows.record_usage(service.conn, clean)
    return {"recorded": len(clean)}


@op("usage", {}, {"since": TIME, "by": STR})
def usage(service: Service, me: Identity, since: int = 0, by: str = "user") -> dict:
    """The gateway's requests and tokens since `since`, summed by user, key or model (everyone's, like report)."""
    if by not in ("user", "key", "model"):
        raise BadInput(f"by {by[:20]!r}: use user, key or model")
    return {"since": since, "by": by, "rows": rows.usage(service.conn, since, by)}
