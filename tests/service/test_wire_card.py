"""One card on the wire (app.gpu.model.WireCard): the `fleet` operation carries it less FLEET_LEAVES_OUT, and
`board status` a view of it less STATUS_LEAVES_OUT (`--json` less app.output.STATUS_JSON_LEAVES_OUT too), so a field
added to the card reaches both or is left out of one by name. Through the real service in this process: two hosts
on one database file with a clock the test moves, the other one down, so that every field of the card shows up."""

from __future__ import annotations

import pytest
from msgspec import structs

from app.client.local import LocalClient
from app.config import Config, FleetSettings, HistorySettings
from app.core.cardstate import STATUS_LEAVES_OUT, STATUS_NESTS, STATUS_PROCESS_LEAVES_OUT, UNKNOWN_USER
from app.core.identity import Identity
from app.gpu import open_source
from app.gpu.model import FLEET_LEAVES_OUT, CardReading, GpuProcess, WireCard, WireProcess
from app.output import STATUS_JSON_LEAVES_OUT, status_json
from app.service.fleet.hosts import beat
from tests.conftest import FROZEN_NOW, Clock

ALICE = Identity("alice", 50001, False)
CARD = set(WireCard.__annotations__)
PROCESS = set(WireProcess.__annotations__)
# `board status --json`'s card as docs/json.md shows it, in its order; a down host's cards add the last two.
STATUS_JSON_CARD = ["host", "index", "uuid", "name", "label", "memory_total_mib", "memory_used_mib", "utilization_pct",
                    "temperature_c", "power_w", "power_limit_w", "pci_bus_id", "state", "pcie", "warnings", "booking",
                    "next_booking", "processes"]
DOWN = ["host_down", "down_since"]


@pytest.fixture(scope="module")
def replies(tmp_path_factory) -> dict:
    """gpu1's `fleet` reply, its `status` reply and `board status --json` of it, with alice's booking on card 0 and
    gpu2 (whose heartbeat is late) down."""
    root, clock = tmp_path_factory.mktemp("wire-card"), Clock(FROZEN_NOW)
    services = []
    for name in ("gpu1", "gpu2"):
        config = Config(db_path=root / "board.db", history=HistorySettings(db=str(root / f"{name}.db")),
                        fleet=FleetSettings(host=name, heartbeat_timeout_s=5))
        services.append(LocalClient.on(config, open_source(True, clock=clock, host=name), ALICE, clock=clock))
    gpu1, gpu2 = services
    try:
        gpu1.call("book", cards=[0], start=int(clock()), end=int(clock()) + 3600)
        beat(gpu2.service)
        clock.now += 6
        status = gpu1.call("status")
        return {"fleet": gpu1.call("fleet"), "status": status, "json": status_json(status)}
    finally:
        for client in services:
            client.service.close()


def flat(card: dict) -> dict:
    """A status card with STATUS_NESTS put back under the wire card's names (`pcie.tx_mib_s` -> `pcie_tx_mib_s`)."""
    flattened = {k: v for k, v in card.items() if k not in {outer for outer, _ in STATUS_NESTS.values()}}
    flattened.update({key: card[outer][inner] for key, (outer, inner) in STATUS_NESTS.items()})
    return flattened


def test_the_wire_card_carries_every_field_of_the_reading_and_of_its_processes():
    """Wrong versions: a field added to CardReading (or GpuProcess) and not to WireCard (or WireProcess); a name in
    a LEAVES_OUT list that is no field of the card (a typo leaves the real field shown)."""
    assert CARD - FLEET_LEAVES_OUT == {f.name for f in structs.fields(CardReading)}
    assert PROCESS == {f.name for f in structs.fields(GpuProcess)}
    assert FLEET_LEAVES_OUT | STATUS_LEAVES_OUT | set(STATUS_NESTS) | STATUS_JSON_LEAVES_OUT <= CARD
    assert STATUS_PROCESS_LEAVES_OUT <= PROCESS


def test_the_fleet_reply_carries_every_field_of_the_card_but_those_it_leaves_out(replies):
    """Wrong versions: card_to_wire forgets a field (or a process's); a field the fleet sends marked NotRequired (the
    fleet's view leaves those out)."""
    cards = replies["fleet"]["cards"]
    assert len(cards) == 8
    for card in cards:
        assert set(card) == CARD - FLEET_LEAVES_OUT, card["index"]
        assert all(set(p) == PROCESS for p in card["processes"])
    assert any(card["processes"] for card in cards)


def test_status_json_shows_every_field_of_the_card_but_those_it_leaves_out(replies):
    """Every field of the card is in `board status --json` (a down host's cards included) or left out by name.
    Wrong versions: the status card built by hand again and a field added to the card missing from it; a field
    STATUS_LEAVES_OUT names shown all the same; a process field left out and shown."""
    shown = set().union(*(flat(card) for card in replies["json"]["cards"]))
    assert shown == CARD - STATUS_LEAVES_OUT - STATUS_JSON_LEAVES_OUT
    assert set(flat(replies["status"]["cards"][0])) == CARD - STATUS_LEAVES_OUT - set(DOWN)  # the reply: `users` too
    processes = [p for card in replies["json"]["cards"] for p in card["processes"]]
    assert processes and all(set(p) == PROCESS - STATUS_PROCESS_LEAVES_OUT for p in processes)


def test_status_json_keeps_its_documented_shape_and_order(replies):
    """docs/json.md's card: PCIe nested, a hidden PID's user named, host_down and down_since on a down host's cards
    only. Wrong versions: pcie flat; a field moved; `users` shown; null for a container's user."""
    cards = replies["json"]["cards"]
    assert [list(card) for card in cards] == [STATUS_JSON_CARD] * 8 + [STATUS_JSON_CARD + DOWN] * 8
    assert [c["host"] for c in cards] == ["gpu1"] * 8 + ["gpu2"] * 8
    assert {c["down_since"] for c in replies["status"]["cards"][8:]} == {FROZEN_NOW}  # its last beat
    assert all(list(c["pcie"]) == ["tx_mib_s", "rx_mib_s"] for c in cards)
    assert [list(p) for c in cards for p in c["processes"]][0] == ["pid", "user", "used_mib", "command", "container"]
    hidden = {p["pid"] for c in replies["fleet"]["cards"] for p in c["processes"] if p["user"] is None}
    assert hidden and {p["user"] for c in cards for p in c["processes"] if p["pid"] in hidden} == {UNKNOWN_USER}


def test_status_shows_the_fleets_values_for_every_field_both_carry(replies):
    """One card, two views of it: the same reading gives the same values. Wrong versions: a nested field swapped
    (tx shown as rx), a field taken from another card or left at null."""
    for fleet, status in zip(replies["fleet"]["cards"], replies["status"]["cards"][:8], strict=True):
        status = flat(status)
        same = set(fleet) & set(status) - {"processes"}
        assert same == CARD - FLEET_LEAVES_OUT - STATUS_LEAVES_OUT - {"processes"}
        assert {k: status[k] for k in same} == {k: fleet[k] for k in same}, fleet["index"]
        assert [p["pid"] for p in status["processes"]] == [p["pid"] for p in fleet["processes"]]
    assert replies["status"]["cards"][0]["booking"]["user"] == "alice"
    assert replies["fleet"]["cards"][0]["pcie_tx_mib_s"] != replies["fleet"]["cards"][0]["pcie_rx_mib_s"]
