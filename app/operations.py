"""Every operation the service speaks, declared once (pip's `commands_dict`): its name, the module of
app.service.ops that registers it, one line on what it does, and its flags.

Both sides read this table: the service imports only the home of the operation it runs, and the socket client
resends after a service restart only what is `resend_safe`. A leaf on the quick path: no imports at all, so
`board book` through the socket pays nothing for it. The request and reply types live beside each handler
(app.service.ops.registry says how a module registers them); a test keeps this table and the registered
operations in step, both ways.
"""

from __future__ import annotations


class Operation:
    """One operation's facts. `changes_bookings`: subscribers reload the bookings after it (was `writes`).
    `frees`: it may free time, so queued bookings move up after it (Service.backfill); it changes bookings too.
    `resend_safe`: it changes nothing, so a client may send it again when the service restarted while answering
    (a change may have landed before the service died)."""

    __slots__ = ("home", "summary", "changes_bookings", "frees", "resend_safe")

    def __init__(self, home: str, summary: str, *, changes_bookings: bool = False, frees: bool = False,
                 resend_safe: bool = False) -> None:
        self.home, self.summary = home, summary
        self.changes_bookings, self.frees, self.resend_safe = changes_bookings or frees, frees, resend_safe

    def __repr__(self) -> str:
        flags = [name for name in ("changes_bookings", "frees", "resend_safe") if getattr(self, name)]
        return f"Operation({self.home!r}, {self.summary!r}{''.join(f', {flag}=True' for flag in flags)})"


def _read(home: str, summary: str) -> Operation:
    return Operation(home, summary, resend_safe=True)


def _change(home: str, summary: str) -> Operation:
    """Changes something other than bookings (keys, records, a card's power): not to be sent twice."""
    return Operation(home, summary)


def _books(home: str, summary: str) -> Operation:
    return Operation(home, summary, changes_bookings=True)


def _frees(home: str, summary: str) -> Operation:
    return Operation(home, summary, frees=True)


OPERATIONS: dict[str, Operation] = {
    # reads: who and what, the fleet and its history, the status, the bookings, the audit log, the report
    "whoami": _read("reads", "who the service says the caller is, and where it keeps the bookings"),
    "stats": _read("reads", "the service's own figures: GPU reads, subscribers, registered processes, memory"),
    "fleet": _read("reads", "the cards as last read: every field, the topology"),
    "history": _read("reads", "each card's recorded VRAM, utilisation, temperature and power over a span"),
    "report": _read("reads", "booked against used GPU-hours per user, class, pool or card"),
    "status": _read("reads", "every card with its state, current and next booking"),
    "get": _read("reads", "one booking"),
    "list": _read("reads", "the bookings in a window, of a user, cancelled ones too if asked"),
    "window": _read("reads", "what the board draws: upcoming bookings and those in the timeline's window"),
    "all_bookings": _read("reads", "every booking since a time, cancelled ones too"),
    "log": _read("reads", "the audit log's latest events, of one booking if asked"),
    # bookings: find a slot, book, change a booking
    "plan": _read("bookings", "the cards and times a booking would get, booking nothing"),
    "next_free": _read("bookings", "the earliest start for a slot on these cards, or on any of a count"),
    "earliest": _read("bookings", "a refusal's second half: the earliest start that works for its search"),
    "slots": _read("bookings", "the earliest slots on different groups of cards (board fit --for)"),
    "book": _books("bookings", "book cards for a span"),
    "cancel": _frees("bookings", "cancel a booking"),
    "release": _frees("bookings", "end a running booking now"),
    "extend": _books("bookings", "give a booking a later end"),
    "reassign": _frees("bookings", "give a booking other cards or another holder"),
    "move": _frees("bookings", "an admin gives a booking new times on the same cards"),
    # a refusal is audited, again if sent again: a true record of a second ask, and nothing else changes
    "run": _read("bookings", "the booking a `board run` job may run under"),
    # series: standing slots
    "series_book": _books("series", "book every occurrence of a rule, all or nothing"),
    "series_get": _read("series", "a series and its bookings"),
    "series_extend": _books("series", "book a series' occurrences up to a later last day"),
    "series_cancel": _frees("series", "cancel a series' bookings from now on"),
    # servers: llama-servers on booked cards, and planned ones
    "serve_start": _books("servers", "check and lease a server on a booking"),
    "serve_get": _read("servers", "one server"),
    "serve_list": _read("servers", "the servers, the caller's or everyone's"),
    "serve_logs": _read("servers", "a server's last log lines"),
    "serve_stop": _books("servers", "stop a server"),
    "serve_key": _read("servers", "a server's own API key, for its holder and admins"),
    "serve_plan": _books("servers", "attach a server spec to a booking or a series"),
    "serve_plans": _read("servers", "the live plans, with each one's next start"),
    "serve_plan_cancel": _books("servers", "cancel a plan"),
    # notify: pushes
    "notify_test": _change("notify", "queue a test message to each push target"),
    "notify_status": _read("notify", "where these outbox rows stand"),
    # faults and alerts
    "faults": _read("faults", "the faults since a time, and their counts by kind"),
    "alerts": _read("alerts", "the alerts, live ones or all"),
    # gateway: per-member keys and the gateway's accounting
    "key_new": _change("gateway", "a new gateway key"),
    "key_list": _read("gateway", "the caller's keys, or everyone's for admins"),
    "key_revoke": _change("gateway", "revoke a gateway key"),
    "gateway_state": _read("gateway", "what the gateway routes by: servers, plans, usable keys"),
    "gateway_usage": _change("gateway", "a batch of the gateway's accounting records"),
    "usage": _read("gateway", "the gateway's requests and tokens summed by user, key or model"),
    # models: the team catalog ([[models]]) started on demand
    "model_demand": _books("models", "the gateway asks for a catalog model: booked and started, or why not and when"),
    "models_touch": _books("models", "the gateway's word that catalog models were used: their leases grow"),
    "models": _read("models", "each catalog model with its state, cards and use today"),
    # projects: what each project has and spends
    "projects": _read("projects", "each project's members, classes, allocations, budget, and use this period"),
    # power: the cards' power limits
    "power": _read("power", "each card's power limit against the policy"),
    "power_step": _change("power", "one step of board power apply: persistence mode or a card's limit"),
}
