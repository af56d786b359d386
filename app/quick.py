"""The `board` entry point, and the quick path for the commands the shell runs most.

Through the shared service, `board status` or `board book 2 --for 3h` is one JSON line each
way: argparse, dataclasses and the rules would cost more than the request. So a command from
QUICK whose every argument this small parser knows goes straight to the socket; in file mode
(BOARD_DB, no shared install) the same parse runs the handler on the service in this process,
which loads only what that command runs. Anything else (help, other commands, a flag it does not
know, two flags argparse would refuse together) goes to the full CLI in app.cli, which owns the
grammar and the messages; a test checks that both parse each quick command the same and run the
same handler.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

# command: (flags without a value, {option: attribute}, (positional attribute, its type) or None, defaults)
QUICK: dict[str, tuple[frozenset, dict, tuple | None, dict]] = {
    "status": (frozenset({"--json", "--short"}), {}, None, {}),
    "whoami": (frozenset({"--json"}), {}, None, {}),
    "book": (
        frozenset({"--json", "--asap", "--or-later"}),
        {"--cards": "cards", "--start": "start", "--for": "duration", "--until": "until", "--class": "klass",
         "--note": "note", "--project": "project"},
        ("count", "card_count"),
        {"cards": None, "start": "now", "duration": None, "until": None, "klass": "experiment", "note": "",
         "count": None, "project": None},
    ),
    "list": (
        frozenset({"--json", "--mine", "--all"}),
        {"--user": "user", "--from": "from_", "--to": "to"},
        None,
        {"user": None, "from_": None, "to": None},
    ),
    "cancel": (frozenset({"--json"}), {}, ("id", "booking_id"), {}),
    "release": (frozenset({"--json"}), {}, ("id", "booking_id"), {}),
}
# Options argparse refuses together; the full CLI says so.
EXCLUSIVE = ({"duration", "until"}, {"mine", "user"}, {"asap", "or_later"}, {"json", "short"})


def _attribute(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")  # as argparse names it


def parse(argv: list[str]) -> SimpleNamespace | None:
    """The arguments as app.cli's parser would give them, or None when this parser is not sure."""
    if not argv or argv[0] not in QUICK:
        return None
    flags, options, positional, defaults = QUICK[argv[0]]
    values: dict = {**defaults, **{_attribute(flag): False for flag in flags}}
    seen: set[str] = set()
    given_positional = False
    words = iter(argv[1:])
    for word in words:
        if word in flags:
            values[_attribute(word)] = True
            seen.add(_attribute(word))
            continue
        name, equals, value = word.partition("=")
        if name in options:
            if not equals:
                following = next(words, None)
                if following is None or following.startswith("-"):
                    return None
                value = following
            values[options[name]] = value
            seen.add(options[name])
            continue
        if positional is None or given_positional or word.startswith("-"):
            return None
        attribute, kind = positional
        if not (word.isascii() and word.isdigit() and len(word) <= 18 and int(word) > 0):
            return None  # the full parser words the refusal
        values[attribute] = int(word)
        given_positional = True
    if positional is not None and positional[1] == "booking_id" and not given_positional:
        return None
    if any(group <= seen for group in EXCLUSIVE):
        return None
    return SimpleNamespace(**values)


def handler(command: str):
    """The quick command's handler: the very function the full parser runs for it."""
    # from-imports, not importlib: that package (and warnings) would be the quick path's only use of it
    if command in ("status", "whoami"):
        from app.cli import status

        return getattr(status, f"cmd_{command}")
    from app.cli import bookings

    return getattr(bookings, f"cmd_{command}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["__complete"]:  # the completion script's live words (app.cli.completion), never argparse
        from app.cli.completion import words

        return words(argv[1:])
    args = parse(argv)
    if args is None:
        from app.cli import main as full

        return full(argv)
    from app.cli.context import Context, check_arguments, run_command

    if (refusal := check_arguments(argv)) is not None:
        return refusal
    from app.config_file import shared_socket

    path = shared_socket(os.environ)
    if path is None:  # file mode: the context opens the service in this process, loading what the command runs
        return run_command(handler(argv[0]), Context(args))
    from app.client.socket import SocketClient

    return run_command(handler(argv[0]), Context(args, client=SocketClient(path)))


if __name__ == "__main__":
    sys.exit(main())
