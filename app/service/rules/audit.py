"""Who the service is in the audit log when it acts on its own, and the one call that records an event.

A leaf of app.service: the operations, the enforcer and the supervision of servers all record through it,
and it imports none of them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from app.core.identity import Identity
from app.store import events
from app.store.db import write

if TYPE_CHECKING:
    from app.service import Service

# Who the audit log names for what the service does on its own: an admin, so that it may stop anyone's work.
AGENT = Identity(name="board-agent", uid=os.getuid(), is_admin=True)


def audit(service: Service, me: Identity, action: str, booking_id: int | None, *, ok: bool, details: dict) -> None:
    """One audit event, in its own write transaction."""
    with write(service.conn):
        events.record(service.conn, ts=int(service.clock()), uid=me.uid, actor=me.name, action=action,
                      booking_id=booking_id, ok=ok, details=details)
