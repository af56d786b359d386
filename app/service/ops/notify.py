"""The `notify_test` and `notify_status` operations: admins only, since a test posts to the team's chat."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.identity import Identity
from app.core.text import inert
from app.errors import BadInput, NotPermitted
from app.service.ops.registry import LIST, STR, op
from app.store import events
from app.store.db import write

if TYPE_CHECKING:
    from app.service import Service

TEST_ATTEMPTS = 1  # a test reports its one try; it is not retried behind the admin's back


def _admin(service: Service, me: Identity, what: str) -> None:
    if not me.is_admin:
        raise NotPermitted(f"{what} is for admins (group {service.config.admin_group}): it posts to the team's chat")


@op("notify_test", {}, {"target": STR})
def notify_test(service: Service, me: Identity, target: str | None = None) -> dict:
    """Queue one test message to each target (or the named one), ahead of everything else; returns the ids to
    follow with notify_status. Without a delivery thread (the service in this process) it is sent here."""
    _admin(service, me, "board notify test")
    from app.notify import outbox  # start-up: a command in process loads pushes only for these operations
    from app.notify.formats import Message  # start-up: as above
    from app.service.box.notify import deliverer  # start-up: as above

    settings = service.config.notify
    names = [t.name for t in settings.targets]
    if not names:
        raise BadInput(f"no [[notify.targets]] in {service.config.path or 'the config'}; add one with type and url")
    if target is not None and target not in names:
        raise BadInput(f"no target {inert(target, 40)!r}; the targets are: {', '.join(names)}")
    now = int(service.clock())
    chosen = tuple(names if target is None else [target])
    message = Message("test", now, "board: a test message",
                      (f"{me.name} sent this with 'board notify test'. Alerts and the board summary come here.",))
    with write(service.conn):
        ids = outbox.enqueue(service.conn, settings, message, now=now, targets=chosen, max_attempts=TEST_ATTEMPTS)
        events.record(service.conn, ts=now, uid=me.uid, actor=me.name, action="notify-test", booking_id=None,
                      ok=True, details={"targets": list(chosen)})
    if service.notifier is not None:
        service.notifier.wake.set()
    else:
        inline = deliverer(service, lambda fn: fn(), lambda line: None)  # the outcome is the answer
        for row in outbox.rows(service.conn, ids):
            inline.deliver(row)
    return {"ids": ids, "wait_s": settings.timeout_s * (len(ids) + 1) + 30}


@op("notify_status", {"ids": LIST})
def notify_status(service: Service, me: Identity, ids: list) -> list:
    """Where these outbox rows stand: state, attempts, the last HTTP status and error (never a url)."""
    _admin(service, me, "board notify status")
    from app.notify import outbox  # start-up: a command in process loads pushes only for these operations
    from app.notify.deliver import describe  # start-up: as above

    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 < i < 2**63 for i in ids) or len(ids) > 100:
        raise BadInput("notify_status: ids is a list of up to 100 outbox ids")
    targets = {t.name: t for t in service.config.notify.targets}
    return [{"id": r.id, "target": r.target, "where": describe(targets[r.target]) if r.target in targets else r.target,
             "state": r.state, "attempts": r.attempts, "status": r.last_status, "error": r.last_error}
            for r in outbox.rows(service.conn, ids)]
