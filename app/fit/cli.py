"""`board fit MODEL.gguf`: how much memory llama-server will take per card, and how many cards it needs.

app.cli's build_parser calls add_parser(); numpy and gguf load only when the command runs.
"""

from __future__ import annotations

import argparse

from app.fit.estimate import CACHE_TYPES, CARD_COUNTS

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


def settings_from(args: argparse.Namespace):
    from app.fit.estimate import Settings

    return Settings(ctx=args.ctx, parallel=args.parallel, cache_type_k=args.cache_type_k,
                    cache_type_v=args.cache_type_v, flash_attn=ON_OFF[args.flash_attn], unified=args.kv_unified)


def cmd_fit(ctx) -> int:
    from app.fit.gguf_model import read_model
    from app.fit.report import DEFAULT_CARD_MIB, fit, render
    from app.output import EXIT_OK, print_json

    args = ctx.args
    settings = ctx.config.fit
    model = read_model(args.model)
    result = fit(model, settings_from(args), card_mib=settings.card_mib or DEFAULT_CARD_MIB,
                 overhead_mib=settings.overhead_mib, max_fill=settings.max_fill,
                 counts=(args.cards,) if args.cards else CARD_COUNTS)
    if args.json:
        print_json(result.as_json())
    else:
        print(render(result))
    return EXIT_OK
