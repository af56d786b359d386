"""The `board status --json` document: every card with its state, current and next booking, in epochs.

The `status` operation answers with it, and the team's daily summary (app.service.box.notify) is made from it,
so both say what `board status` says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.cardstate import fleet_status, status_card, status_view
from app.service.fleet.lastknown import read_live

if TYPE_CHECKING:
    from app.service import Service


def status_document(service: Service) -> dict:
    """Every card with its state, current and next booking: the `board status --json` document, in epochs. Each
    card carries its host; other hosts' cards follow this host's, as their services last published them, and a
    host whose heartbeat is late has `host_down` and `down_since` on its cards. While a PostgreSQL database is
    unreachable: this host's cards only, with the bookings the service last read, and `stale_since`
    (app.service.fleet.lastknown)."""
    from app.service.fleet.hosts import remote_hosts  # start-up: a leaf; status is the one read that asks the fleet

    snapshot = service.fleet_snapshot()
    now = service.clock()
    live, stale_since = read_live(service, now)
    statuses = fleet_status(snapshot, live, now, hot_celsius=service.config.hot_celsius, labels=service.config.labels,
                            host=service.host)
    cards = [status_view(status_card(s)) for s in statuses]
    hosts = [{"host": service.host, "down": False, "seen_at": now}]
    if stale_since is not None:  # the database away: this host's cards, with the bookings as last read
        return {"simulated": snapshot.simulated, "taken_at": snapshot.taken_at, "host": service.host, "hosts": hosts,
                "cards": cards, "stale_since": stale_since}
    for remote in remote_hosts(service):
        hosts.append({"host": remote.host, "down": remote.down, "seen_at": remote.seen_at})
        cards.extend(status_view(status_card(s)) for s in fleet_status(
            remote.snapshot, live, now, hot_celsius=service.config.hot_celsius, host=remote.host,
            down_since=remote.seen_at if remote.down else None))
    return {"simulated": snapshot.simulated, "taken_at": snapshot.taken_at, "host": service.host, "hosts": hosts,
            "cards": cards}

