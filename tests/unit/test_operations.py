"""The operations' table (app.operations): every fact about an operation is written there once, and the handlers
registered from app.service.ops agree with it, both ways."""

from __future__ import annotations

import msgspec

from app.errors import BoardError

from app.operations import OPERATIONS
from tests.unit.test_import_hygiene import loaded_after

def test_every_operation_in_the_table_registers_from_its_home_module_and_nothing_else_registers():
    """Both ways: each table entry is registered by the module the table names (so the service, which imports only
    that module, finds it), with a request type; and every registered operation is in the table. Wrong versions: an
    operation registered in another module than its home; one registered and left out of the table."""
    from app.service.ops import OPS
    from app.service.ops.registry import Request, lookup

    assert set(OPS) == set(OPERATIONS), sorted(set(OPS) ^ set(OPERATIONS))
    assert {name: entry.handler.__module__ for name, entry in OPS.items()} == \
        {name: f"app.service.ops.{entry.home}" for name, entry in OPERATIONS.items()}
    assert all(issubclass(entry.request, Request) for entry in OPS.values())
    assert lookup("book") is OPS["book"]
    assert lookup("no_such_operation") is None and lookup(["book"]) is None


def test_every_request_is_frozen_and_refuses_unknown_fields():
    """mypy takes a request that does not say frozen=True for a mutable one (registry.Request), so each says it;
    msgspec gives each the base's settings. Wrong versions: a request whose base loses forbid_unknown_fields; the
    `class` rename dropped."""
    from app.service.ops import OPS

    for name, entry in OPS.items():
        if entry.request is not None:
            config = entry.request.__struct_config__
            assert config.frozen and config.forbid_unknown_fields, name
            names = {f.name: f.encode_name for f in msgspec.structs.fields(entry.request)}
            assert names.get("klass", "class") == "class" and names.get("first", "from") == "from", name


def test_the_flags_agree_an_operation_that_changes_bookings_is_never_resent():
    """A change may have landed before the service died, so it is never resend_safe; one that frees time changes
    bookings (subscribers reload). Wrong versions: `book` marked resend_safe; `cancel` frees without
    changes_bookings."""
    for name, entry in OPERATIONS.items():
        assert not (entry.changes_bookings and entry.resend_safe), name
        assert entry.changes_bookings or not entry.frees, name
        assert entry.summary and "\n" not in entry.summary, name
    # the reads the old hand-kept list left out are resent now
    assert all(OPERATIONS[name].resend_safe for name in ("history", "report", "slots", "serve_list", "serve_logs"))


def test_subscribers_reload_after_exactly_the_operations_the_table_says_change_bookings(tmp_path):
    """A real service on a SQLite file: the bookings' version (what open boards reload on) moves after an operation
    that changes bookings and after no other. Wrong versions: Service.call bumping after every operation; the
    registered entry keeping a flag of its own (`@op(..., writes=True)` on a read, or none on extend)."""
    import os
    import pwd

    from app.config import Config
    from app.core.identity import Identity
    from app.gpu import open_source
    from app.gpu.fleet import Fleet
    from app.service import Service
    from tests.conftest import FROZEN_NOW

    clock = lambda: FROZEN_NOW  # noqa: E731
    service = Service(Config(db_path=tmp_path / "board.db"), Fleet(open_source(True, clock=clock), 1.0),
                      clock=clock)
    me = Identity(pwd.getpwuid(os.getuid()).pw_name, os.getuid(), True)
    start, end = FROZEN_NOW + 3600, FROZEN_NOW + 7200
    calls = [("plan", {"start": start, "end": end, "count": 1}), ("slots", {"start": start, "end": end}),
             ("book", {"start": start, "end": end, "cards": [0]}), ("get", {"id": 1}), ("list", {}),
             ("extend", {"id": 1, "add_seconds": 600}), ("history", {"seconds": 60}), ("cancel", {"id": 1}),
             ("whoami", {}), ("series_get", {"id": 1})]
    seen = []
    try:
        for op, args in calls:
            before = service.hub.versions["bookings"]
            try:
                service.call(me, op, args)
            except BoardError:  # series_get: no series 1; the version stays, as for any refused read
                pass
            seen.append((op, service.hub.versions["bookings"] != before))
    finally:
        service.close()
    assert seen == [(op, OPERATIONS[op].changes_bookings) for op, _ in calls]
    assert {op for op, moved in seen if moved} == {"book", "extend", "cancel"}


def test_the_table_loads_nothing_and_the_socket_path_no_msgspec():
    """Both sides import the table, the socket client only when the service dropped a request; the socket's quick
    path stays json and socket. Wrong versions: app.operations importing dataclasses or typing's NamedTuple;
    app.client.socket importing the registry for its flags, or the table at module level."""
    before = loaded_after("import app")
    assert loaded_after("import app.operations") - before == {"__future__", "app.operations"}  # __future__: no code
    assert not loaded_after("import app.client.socket") & {"msgspec", "app.service", "app.service.ops.registry",
                                                           "app.operations"}
