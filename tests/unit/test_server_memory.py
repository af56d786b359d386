"""A server's memory beside its estimate: schema v4's two JSON columns, what the service accepts into them (the
estimate from a client, llama.cpp's figures from a supervisor), and how `serve list` and the TUI show them.

The real thing (a llama-server whose log the supervisor reads) is tests/llama/test_servers.py's
TestMemory; these are the rules and shapes, on real SQLite files."""

from __future__ import annotations

import json
import logging
import os
import sqlite3

import pytest

from app.config import Config, LlamaSettings
from app.core.identity import Identity
from app.errors import BadInput
from app.llama import rows
from app.cli.serve import memory_cell
from app.llama.rows import Server, check_estimate, check_measured
from app.llama.service import ServerService
from app.service.rules.bookings import BookingService
from app.store import schema
from app.store.db import MalformedRow, connect, write
from tests.conftest import FROZEN_NOW

# What the supervisor sends: Measured.to_json of the CPU server's log on the "mid" shape (tests/fit/shapes.py).
MEASURED = {
    "source": "lines",
    "devices": {"CPU_Mapped": {"weights_mib": 91.05, "kv_mib": 0.0, "compute_mib": 0.0, "output_mib": 0.0},
                "CPU": {"weights_mib": 0.0, "kv_mib": 2.0, "compute_mib": 13.38, "output_mib": 0.0}},
    "kv_cells": 256, "kv_seqs": 1,
    "kv_caches": [{"mib": 2.0, "cells": 256, "layers": 4, "seqs": 1, "streams": 1, "type_k": "f16", "type_v": "f16",
                   "k_mib": 1.0, "v_mib": 1.0}],
    "n_ctx": 256, "n_ctx_seq": 256,
}
ESTIMATE = {"per_card_mib": [620, 610], "limit_mib": 29491, "fits": True, "forced": False}


def device(weights=0.0, kv=0.0, compute=0.0, output=0.0) -> dict:
    return {"weights_mib": weights, "kv_mib": kv, "compute_mib": compute, "output_mib": output}


def measured_with(**changes) -> dict:
    return {**MEASURED, **changes}


# -- the migration --------------------------------------------------------------------------------


def test_a_v3_database_gains_the_memory_columns_and_keeps_its_servers(db_path):
    raw = sqlite3.connect(db_path, isolation_level=None)
    for script in schema.MIGRATIONS[:3]:  # the database as board v3 left it
        for statement in schema._statements(script):
            raw.execute(statement)
    raw.execute("PRAGMA user_version = 3")
    raw.execute("INSERT INTO bookings (id, user, uid, starts_at, ends_at, created_at, created_by)"
                " VALUES (1, 'alice', 1001, 0, 3600, 0, 1001)")
    raw.execute("INSERT INTO servers (booking_id, user, uid, cards, card_uuids, model, host, port, cmdline, state,"
                " created_at) VALUES (1, 'alice', 1001, '[0]', '[\"GPU-0\"]', '/m.gguf', '127.0.0.1', 8080,"
                " '[\"llama-server\"]', 'stopped', 5)")
    assert "estimate" not in [c[1] for c in raw.execute("PRAGMA table_info(servers)")]
    raw.close()

    conn = connect(db_path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.LATEST >= 4
        columns = [c[1] for c in conn.execute("PRAGMA table_info(servers)")]
        assert {"estimate", "measured"} <= set(columns)
        server = rows.get(conn, 1)
        assert server is not None and (server.model, server.state, server.created_at) == ("/m.gguf", "stopped", 5)
        assert server.estimate is None and server.measured is None
        with write(conn):
            rows.set_measured(conn, 1, check_measured(MEASURED))
        assert rows.get(conn, 1).measured == MEASURED
    finally:
        conn.close()


# -- the row: stored, read back, and a hand edit that breaks it ---------------------------------------


@pytest.fixture
def one_server(conn):
    with write(conn):
        conn.execute('INSERT INTO bookings (id, "user", uid, starts_at, ends_at, created_at, created_by)'
                     " VALUES (1, 'alice', 1001, 0, 3600, 0, 1001)")
        rows.insert(conn, booking_id=1, user="alice", uid=1001, cards=[0, 1], card_uuids=["GPU-0", "GPU-1"],
                    model="/m.gguf", alias=None, host="127.0.0.1", port=8080, ctx=256, parallel=1, split_mode="layer",
                    metrics=False, cmdline=["llama-server"], now=FROZEN_NOW, estimate=ESTIMATE)
    return conn


def test_the_estimate_and_the_measured_figures_round_trip(one_server):
    server = rows.get(one_server, 1)
    assert server.estimate == ESTIMATE and server.measured is None
    with write(one_server):
        rows.set_measured(one_server, 1, check_measured(MEASURED))
    server = rows.get(one_server, 1)
    assert server.measured == MEASURED
    assert rows.server_from_wire(json.loads(json.dumps(rows.server_to_wire(server)))) == server


@pytest.mark.parametrize("column, text", [
    ("measured", "oops"),
    ("measured", "[]"),
    ("measured", '{"source": "lines"}'),
    ("measured", json.dumps(measured_with(source="guess"))),
    ("measured", json.dumps(measured_with(devices={"CPU": device(weights=-1.0)}))),
    ("measured", json.dumps(measured_with(devices={"CPU": {"weights_mib": "91"}}))),
    ("measured", json.dumps(measured_with(devices={f"CUDA{n}": device(1.0) for n in range(17)}))),
    ("measured", json.dumps(measured_with(devices={"x" * 65: device(1.0)}))),
    ("measured", json.dumps(measured_with(devices={"CPU\x1b[31m": device(1.0)}))),
    ("measured", json.dumps(measured_with(devices={"CPU": device(float(1 << 31))}))),
    ("measured", '{"source": "lines", "devices": {"CPU": {"weights_mib": 1' + "0" * 400 + ', "kv_mib": 0,'
                 ' "compute_mib": 0, "output_mib": 0}}}'),  # an integer no float holds
    ("measured", "[" * 100_000 + "]" * 100_000),
    ("measured", "42"),
    ("estimate", "{"),
    ("estimate", '{"per_card_mib": ["620"], "limit_mib": 1, "fits": true, "forced": false}'),
    ("estimate", '{"per_card_mib": [], "limit_mib": 1, "fits": true, "forced": false}'),
    ("estimate", '{"per_card_mib": [620], "limit_mib": 1.5, "fits": true, "forced": false}'),
    ("estimate", '{"per_card_mib": [620], "limit_mib": 1, "fits": "yes", "forced": false}'),
    ("estimate", '{"per_card_mib": [620], "limit_mib": 1, "fits": true}'),
])
def test_a_hand_edited_memory_column_reads_as_a_malformed_row(one_server, column, text, caplog):
    one_server.execute(f"UPDATE servers SET {column} = ? WHERE id = 1", (text,))
    row = one_server.execute(f"SELECT {rows._COLUMNS} FROM servers WHERE id = 1").fetchone()
    with pytest.raises(MalformedRow, match=f"^{column} "):
        rows._server(row)
    with caplog.at_level(logging.WARNING):
        assert rows.get(one_server, 1) is None and rows.listing(one_server) == []
    assert [r.getMessage() for r in caplog.records if "is malformed" in r.getMessage()][0].startswith(
        f"server 1 is malformed: {column} ")


# -- the shapes -------------------------------------------------------------------------------------


def test_check_estimate_keeps_the_four_figures_and_drops_the_rest():
    assert check_estimate({**ESTIMATE, "note": "x" * 1000}) == ESTIMATE


def test_check_measured_normalises_through_measured():
    sent = measured_with(devices={"CUDA0": {**device(1.004, 2, 3), "extra": 1}}, unknown="x")
    assert check_measured(sent)["devices"] == {"CUDA0": device(1.0, 2.0, 3.0)}
    assert "unknown" not in check_measured(sent)
    assert check_measured(measured_with(devices={f"CUDA{n}": device(1.0) for n in range(16)}))  # 16 is allowed


# -- what the service takes -------------------------------------------------------------------------


@pytest.fixture
def world(tmp_path, fleet):
    """alice, a booking of cards 0 and 1 active now, and the server rules as the service runs them."""
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    config = Config(db_path=tmp_path / "board.db", llama=LlamaSettings(server_bin=str(binary)))
    me = Identity("alice", os.getuid(), False)
    conn = connect(config.db_path)
    booking = BookingService(conn, me, config, fleet.cards, fleet.topology, lambda: FROZEN_NOW).create(
        cards=[0, 1], start=FROZEN_NOW, end=FROZEN_NOW + 3600)
    rules = ServerService(conn, me, config, topology=fleet.topology, clock=lambda: FROZEN_NOW, environ={})
    yield rules, booking.id
    conn.close()


def written(conn) -> tuple:
    return (conn.execute("SELECT count(*) FROM servers").fetchone()[0],
            conn.execute("SELECT count(*) FROM events").fetchone()[0])


def test_the_start_stores_the_estimate_it_was_checked_against(world):
    rules, booking = world
    server = rules.prepare(booking, model="/models/m.gguf", fit={**ESTIMATE, "by": "a newer client"})
    assert server.estimate == ESTIMATE and server.measured is None
    assert rows.get(rules.conn, server.id).estimate == ESTIMATE
    [details] = [json.loads(d) for (d,) in rules.conn.execute("SELECT details FROM events WHERE action = 'server-start'")]
    assert details["fit"] == ESTIMATE
    assert rules.prepare(booking, model="/models/m.gguf").estimate is None  # no estimate (an unknown architecture)


@pytest.mark.parametrize("fit, why", [
    ({**ESTIMATE, "per_card_mib": [620]}, "1 figures for 2 booked cards"),
    ({**ESTIMATE, "per_card_mib": [620, 610, 600]}, "3 figures for 2 booked cards"),
    ({**ESTIMATE, "per_card_mib": ["620", 610]}, "per_card_mib is not a list of whole MiB"),
    ({**ESTIMATE, "per_card_mib": [True, 610]}, "per_card_mib is not a list of whole MiB"),
    ({**ESTIMATE, "per_card_mib": [-1, 610]}, "per_card_mib is not a list of whole MiB"),
    ({**ESTIMATE, "per_card_mib": [1 << 40, 610]}, "per_card_mib is not a list of whole MiB"),
    ({**ESTIMATE, "per_card_mib": "620,610"}, "per_card_mib is not a list of whole MiB"),
    ({**ESTIMATE, "limit_mib": None}, "limit_mib is not a whole number"),
    ({**ESTIMATE, "fits": 1}, "fits is not true or false"),
    ({k: v for k, v in ESTIMATE.items() if k != "forced"}, "forced is not true or false"),
    ({}, "per_card_mib is not a list"),
])
def test_a_junk_estimate_is_refused_and_nothing_is_written(world, fit, why):
    rules, booking = world
    before = written(rules.conn)
    with pytest.raises(BadInput, match=f"^serve_start: fit: {why}") as refused:
        rules.prepare(booking, model="/models/m.gguf", fit=fit)
    assert refused.value.exit_code == 2
    assert written(rules.conn) == before


def test_ready_records_llama_cpps_figures_with_the_state(world):
    rules, booking = world
    server = rules.prepare(booking, model="/models/m.gguf", fit=ESTIMATE)
    assert rules.ready(server.id, measured=MEASURED)
    after = rules.get(server.id)
    assert (after.state, after.ready_at, after.measured) == ("ready", FROZEN_NOW, MEASURED)
    assert not rules.ready(server.id, measured=measured_with(n_ctx=1))  # once: a second report changes nothing
    assert rules.get(server.id).measured == MEASURED


@pytest.mark.parametrize("junk", [
    "lines", [MEASURED], {"devices": {}}, measured_with(devices={f"CUDA{n}": device(1.0) for n in range(17)}),
    measured_with(devices={"CPU": device(weights=float("nan"))}), measured_with(devices={"CPU": device(10 ** 400)}),
    measured_with(kv_caches=[{"mib": 1}]), measured_with(kv_cells=-1),
])
def test_a_junk_memory_report_is_ignored_and_the_server_is_still_ready(world, junk):
    rules, booking = world
    server = rules.prepare(booking, model="/models/m.gguf")
    assert rules.ready(server.id, measured=junk)
    after = rules.get(server.id)
    assert after.state == "ready" and after.measured is None


def test_a_ready_report_without_figures_leaves_them_unknown(world):
    rules, booking = world
    server = rules.prepare(booking, model="/models/m.gguf")
    assert rules.ready(server.id)
    assert rules.get(server.id).measured is None


# -- how they are shown -----------------------------------------------------------------------------


def server_with(**fields) -> Server:
    base = dict(id=1, booking_id=1, user="alice", uid=1001, cards=(3, 5), card_uuids=("GPU-3", "GPU-5"),
                model="/m.gguf", alias="m", host="127.0.0.1", port=8080, ctx=4096, parallel=1, split_mode="layer",
                metrics=False, cmdline=("llama-server",), log_path="", state="ready")
    return Server(**{**base, **fields})


def gpu_measured(*per_card: tuple[float, float, float], host: float = 0.0) -> dict:
    devices = {f"CUDA{n}": device(*figures) for n, figures in enumerate(per_card)}
    if host:
        devices["CPU_Mapped"] = device(host)
    return measured_with(devices=devices)


@pytest.mark.parametrize("fields, cell", [
    ({}, "-"),
    ({"estimate": {**ESTIMATE, "per_card_mib": [5222, 5222]},
      "measured": gpu_measured((4500, 400, 100.35), (4500, 400, 100.35))}, "9.8/10.2G"),  # 10035 MiB / 10444 MiB
    ({"measured": MEASURED}, "106/-M"),
    ({"estimate": {**ESTIMATE, "per_card_mib": [600, 24]}}, "-/624M"),
    ({"estimate": {**ESTIMATE, "per_card_mib": [600, 24]}, "measured": MEASURED}, "106/624M"),
    ({"estimate": {**ESTIMATE, "per_card_mib": [1000, 23]}, "measured": MEASURED}, "106/1023M"),
    ({"estimate": {**ESTIMATE, "per_card_mib": [1000, 24]}, "measured": MEASURED}, "0.1/1.0G"),  # a GiB: in GiB
    ({"estimate": ESTIMATE, "measured": MEASURED}, "0.1/1.2G"),
    ({"estimate": {"per_card_mib": "junk"}, "measured": {"source": "junk"}}, "-"),  # an odd service: unknown
])
def test_serve_lists_mem_column(fields, cell):
    assert memory_cell(server_with(**fields)) == cell


def test_the_tui_line_shows_both_for_the_server_and_for_one_card():
    pytest.importorskip("textual")
    from app.tui.screens.servers import memory_text

    assert memory_text(server_with()) is None
    assert memory_text(server_with(measured=MEASURED, estimate=ESTIMATE)) == (
        "memory: measured 106 MiB (weights 91.0, KV 2.0, compute 13.4) · estimated 1,230 MiB")
    assert memory_text(server_with(estimate=ESTIMATE)) == "memory: measured - · estimated 1,230 MiB"
    forced = {**ESTIMATE, "fits": False, "forced": True, "limit_mib": 600}
    assert memory_text(server_with(estimate=forced)).endswith("estimated 1,230 MiB, over the 600 MiB limit (forced)")

    # On a card: that card's device (CUDA<n>, n its place in the server's cards) and its own estimate.
    split = server_with(measured=gpu_measured((4500, 400, 100), (4400, 300, 90), host=250), estimate=ESTIMATE)
    assert memory_text(split, card=5) == (
        "memory on this card: measured 4,790 MiB (weights 4,400, KV 300, compute 90.0) · estimated 610 MiB")
    assert memory_text(split, card=3).startswith("memory on this card: measured 5,000 MiB")
    assert memory_text(split, card=3).endswith("estimated 620 MiB")
    assert memory_text(split).startswith("memory: measured 10,040 MiB (weights 9,150,")  # host buffers included
    # A CPU build names no CUDA device: the card shows the server's totals.
    assert memory_text(server_with(measured=MEASURED, estimate=ESTIMATE), card=5).startswith("memory: measured 106 MiB")
