"""`board fit MODEL.gguf`: how much memory llama-server will take per card, and how many cards it needs.

Also the request options `book --model` shares. numpy and gguf load only when the command runs.
"""

from __future__ import annotations

import argparse

from app.fit.estimate import CACHE_TYPES, CARD_COUNTS
from app.errors import BoardError
from app.output import EXIT_OK, iso, print_json

ON_OFF = {"on": True, "off": False}


def positive(text: str) -> int:
    value = int(text) if text.isascii() and text.isdigit() and len(text) <= 9 else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number of 1 or more")
    return value


def add_request_options(p: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    """The request in memory terms, shared by `fit` and `book --model`."""
    p.add_argument("--ctx", type=positive, default=4096 if defaults else None,
                   help="total context over all slots (llama-server -c; default 4096)")
    p.add_argument("--parallel", "-np", type=positive, default=1 if defaults else None,
                   help="slots: requests served at once (llama-server -np; default 1)")
    p.add_argument("--cache-type-k", choices=tuple(CACHE_TYPES), default="f16", help="K cache type (default f16)")
    p.add_argument("--cache-type-v", choices=tuple(CACHE_TYPES), default="f16",
                   help="V cache type (default f16; a quantised V cache needs flash attention)")
    p.add_argument("--flash-attn", choices=tuple(ON_OFF), default="on", help="flash attention (default on)")
    p.add_argument("--kv-unified", action="store_true", help="one KV cache shared by all slots (llama-server -kvu)")


def add_parser(command) -> None:
    p = command("fit", cmd_fit, "how much memory a model takes per card, and how many cards it needs", json_flag=True)
    p.add_argument("model", help="the .gguf file (the first file of a split model)")
    add_request_options(p)
    p.add_argument("--cards", type=positive, choices=CARD_COUNTS, metavar="N",
                   help="only this many cards (1, 2, 4 or 8; default: all four options)")
    p.add_argument("--for", dest="duration", metavar="DUR",
                   help="also find the earliest slots of this length where a group that fits is free (asks the service)")
    p.add_argument("--start", default="now", help="with --for: from when to search (default now)")
    p.add_argument("--class", dest="klass", default="experiment", metavar="CLASS",
                   help="with --for: the booking class the slots must allow (default experiment)")


def settings_from(args: argparse.Namespace):
    from app.fit.estimate import Settings

    return Settings(ctx=args.ctx, parallel=args.parallel, cache_type_k=args.cache_type_k,
                    cache_type_v=args.cache_type_v, flash_attn=ON_OFF[args.flash_attn], unified=args.kv_unified)


def cmd_fit(ctx) -> int:
    from app.fit.gguf_model import read_model
    from app.fit.report import DEFAULT_CARD_MIB, fit, render, with_measured

    args = ctx.args
    settings = ctx.config.fit
    model = read_model(args.model)
    result = fit(model, settings_from(args), card_mib=settings.card_mib or DEFAULT_CARD_MIB,
                 overhead_mib=settings.overhead_mib, max_fill=settings.max_fill,
                 cards=args.cards)
    # The service is asked only where it runs anyway (the shared install) or --for needs it: a plain fit on
    # a development machine opens no database and reads no GPU.
    asks = bool(ctx.config.service.socket or args.duration)
    if asks and (server := _measured(ctx, model, result.settings)) is not None:
        result = with_measured(result, server, overhead_mib=settings.overhead_mib)
    slots = _slots(ctx, result) if args.duration else None
    if args.json:
        shown = [{k: v for k, v in s.items() if k != "at"} for s in slots] if slots is not None else None
        print_json({**result.as_json(), **({"slots": shown} if shown is not None else {})})
    else:
        print(render(result))
        if slots is not None:
            print(_slot_text(ctx, slots, result.smallest_fit))
    return EXIT_OK


def _measured(ctx, model, settings) -> dict | None:
    """The latest server of this model and settings that logged its memory, if the service can be asked."""
    from app.fit.report import same_request

    try:
        servers = ctx.client.call("serve_list", all=True, limit=500)
    except BoardError:  # no service, or no database: the estimate stands alone
        return None
    found = [s for s in servers if s.get("measured") and same_request(s, model, settings)]
    return max(found, key=lambda s: s.get("ready_at") or 0) if found else None


def _slots(ctx, result) -> list[dict]:
    """The earliest slots where the smallest group that fits is free: the service knows the calendar, the
    pools and what runs on the cards now."""
    from app.core.parse import parse_span

    if result.smallest_fit is None:
        return []
    start, end = parse_span(ctx.args.start, ctx.args.duration, None, ctx.now(), how_long="give --for, such as 3h",
                            night_start=ctx.night_start)
    found = ctx.client.call("slots", start=start, end=end, count=result.smallest_fit, limit=3,
                            **{"class": ctx.args.klass})["slots"]
    return [{"cards": s["cards"], "start": iso(s["start"]), "end": iso(s["end"]),
             "free_until": iso(s["free_until"]) if s["free_until"] is not None else None,
             "pools": _pools(ctx.config, s["cards"]), "at": s["start"]} for s in found]


def _pools(config, cards) -> list[dict]:
    from app.config import CLASSES

    return [{"name": p.name, "classes": list(p.classes) if tuple(p.classes) != CLASSES else None}
            for p in config.pools if set(p.cards) & set(cards)]


def _slot_text(ctx, slots: list[dict], count: int | None) -> str:
    """'now: cards 4,5 until 19:00 only; from 19:00: cards 0-3 (prod, online/batch only)'."""
    import time

    from app.core.text import format_cards, format_time, inert

    if count is None:
        return "when: no group of cards fits this request"
    if not slots:
        return f"when: no {count} free cards take a {ctx.args.klass} booking of {ctx.args.duration} in the calendar's reach"
    now = time.time()
    parts = []
    for s in slots:
        when = "now" if s["at"] <= now + 60 else f"from {format_time(s['at'], now)}"
        text = f"{when}: cards {format_cards(s['cards'])}"
        if s["free_until"]:
            from datetime import datetime

            text += f" until {format_time(int(datetime.fromisoformat(s['free_until']).timestamp()), now)} only"
        pools = [inert(p["name"], 20) + (f", {'/'.join(p['classes'])} only" if p["classes"] else "") for p in s["pools"]]
        if pools:
            text += f" ({'; '.join(pools)})"
        parts.append(text)
    return "when: " + "; ".join(parts)
