"""The `board status --json` document: every card with its state, current and next booking, in epochs.

The `status` operation answers with it, and the team's daily summary (app.service.box.notify) is made from it,
so both say what `board status` says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.cardstate import UNKNOWN_USER, CardStatus, fleet_status
from app.model import booking_to_wire
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
    statuses = fleet_status(snapshot, live, now, hot_celsius=service.config.hot_celsius, labels=service.config.labels)
    cards = [_card(s, service.host) for s in statuses]
    hosts = [{"host": service.host, "down": False, "seen_at": now}]
    if stale_since is not None:  # the database away: this host's cards, with the bookings as last read
        return {"simulated": snapshot.simulated, "taken_at": snapshot.taken_at, "host": service.host, "hosts": hosts,
                "cards": cards, "stale_since": stale_since}
    for remote in remote_hosts(service):
        hosts.append({"host": remote.host, "down": remote.down, "seen_at": remote.seen_at})
        for s in fleet_status(remote.snapshot, live, now, hot_celsius=service.config.hot_celsius):
            card = _card(s, remote.host)
            if remote.down:
                card.update(host_down=True, down_since=remote.seen_at)
            cards.append(card)
    return {"simulated": snapshot.simulated, "taken_at": snapshot.taken_at, "host": service.host, "hosts": hosts,
            "cards": cards}


def _card(s: CardStatus, host: str) -> dict:
    r = s.reading
    return {
        "host": host, "index": r.index, "uuid": r.uuid, "name": r.name, "label": s.label,
        "memory_total_mib": r.memory_total_mib, "memory_used_mib": r.memory_used_mib,
        "utilization_pct": r.utilization_pct, "temperature_c": r.temperature_c, "power_w": r.power_w,
        "power_limit_w": r.power_limit_w, "pci_bus_id": r.pci_bus_id, "state": s.state,
        "pcie": {"tx_mib_s": r.pcie_tx_mib_s, "rx_mib_s": r.pcie_rx_mib_s},
        "warnings": list(s.warnings), "users": list(s.users),
        "booking": booking_to_wire(s.booking) if s.booking else None,
        "next_booking": booking_to_wire(s.next_booking) if s.next_booking else None,
        "processes": [{"pid": p.pid, "user": p.user or UNKNOWN_USER, "used_mib": p.used_mib, "command": p.command,
                       "container": p.container} for p in r.processes],
    }
