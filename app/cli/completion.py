"""Shell completion: `board completion bash|zsh` prints the script, and `board __complete WHAT` the live words it
asks for.

The script is made here from the real parser: a table of the commands, their options and what each value is
(`_board_node`, one case per command), then the logic both shells share (app/completion/complete.sh) and the shell's
own front (board.bash, board.zsh). A flag added to the parser is completed once the script is made again:
scripts/install_shared.sh makes it at each install, and `eval "$(board completion bash)"` at each shell start.
Commands and flags cost no process at all. What only the service or the disk knows is asked for when TAB is
pressed, through the quick path (app.quick runs `words`): `bookings`, the caller's live bookings (one socket round
trip); `cards`, the fleet's card numbers (one); `models`, the *.gguf files under [llama] model_dirs. Each is one
word a line, nothing on stderr, and no words when the service does not answer.

The words offered are data: the table holds only words of letters, digits and - _ . , (others are left out), and
the script never evals a word or hands one to compgen -W (which expands $(...) in its word list).
"""

from __future__ import annotations

import sys

SHELLS = ("bash", "zsh")
WHAT = ("bookings", "cards", "models")
# Options whose value is a file of the caller's: the shell's own file names are offered.
FILE_DESTS = frozenset({"db", "scenario", "path", "password_file"})
TIMEOUT_S = 2.0  # a TAB that waits longer than this on a stuck service offers nothing rather than hang the shell


def add_parser(command) -> None:
    p = command("completion", cmd_completion, "print the shell completion script: eval \"$(board completion bash)\""
                " in ~/.bashrc, or save the zsh one as _board in a folder of $fpath")
    p.add_argument("shell", choices=SHELLS, help="the shell it is for")


def cmd_completion(ctx) -> int:
    sys.stdout.write(script(ctx.args.shell))
    return 0


# -- the script ---------------------------------------------------------------------------------------------------


def _safe(word: str) -> bool:
    """A word the script may hold unquoted: letters, digits and - _ . , (no glob, quote, space or $)."""
    return bool(word) and word.isascii() and all(c.isalnum() or c in "-_.," for c in word)


def value_kind(action) -> str:
    """What an argument's value is, as the script names it: booking, card, model, file, choice:A,B,... or text;
    a trailing + when it stands for every word after it (nargs "*", "+", "...")."""
    import argparse

    from app.cli.arguments import booking_id

    if action.choices is not None:
        choices = [str(choice) for choice in action.choices]
        kind = "choice:" + ",".join(choices) if all(_safe(c) and "," not in c for c in choices) else "text"
    elif action.type is booking_id and action.dest != "series":  # --series reads a series id with booking_id
        kind = "booking"
    elif action.dest == "cards":
        kind = "card"
    elif action.dest == "model":
        kind = "model"
    elif action.dest in FILE_DESTS or action.nargs == argparse.REMAINDER:
        kind = "file"
    else:
        kind = "text"
    return kind + ("+" if action.nargs in ("*", "+", argparse.REMAINDER) else "")


def nodes(parser, path: tuple[str, ...] = ()):
    """(command path, subcommands, option entries, positional kinds) for the parser and every subparser under it.
    An option entry is the option ("--json") or, when it takes a value, "--option=KIND"."""
    import argparse

    subs: list[str] = []
    options: list[str] = []
    positionals: list[str] = []
    below = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if _safe(name):
                    subs.append(name)
                    below.append((name, sub))
        elif action.option_strings:
            kind = "" if action.nargs == 0 else "=" + value_kind(action)
            options += [option + kind for option in action.option_strings if _safe(option)]
        else:
            positionals.append(value_kind(action))
    yield path, subs, options, positionals
    for name, sub in below:
        yield from nodes(sub, (*path, name))


def table(parser) -> str:
    """The shell function `_board_node PATH`, setting _board_subs, _board_opts and _board_args for that command."""
    lines = ["_board_node() {", "    case $1 in"]
    for path, subs, options, positionals in nodes(parser):
        lines.append(f"    '{' '.join(path)}') _board_subs='{' '.join(subs)}' _board_opts='{' '.join(options)}'"
                     f" _board_args='{' '.join(positionals)}' ;;")
    lines += ["    *) _board_subs= _board_opts= _board_args= ;;", "    esac", "}"]
    return "\n".join(lines) + "\n"


def script(shell: str, parser=None) -> str:
    """The completion script for `shell` (bash or zsh), from `parser` (default: board's own)."""
    from importlib.resources import files

    from app import __version__
    from app.cli import build_parser

    here = files("app") / "completion"
    front = (here / f"board.{shell}").read_text()
    head = "#compdef board\n" if shell == "zsh" else ""
    return (f"{head}# {shell} completion for board {__version__}, made by `board completion {shell}` from its parser:"
            " make it again after an upgrade.\n\n"
            + table(parser or build_parser()) + "\n" + (here / "complete.sh").read_text() + "\n" + front)


# -- the live words (the quick path) ------------------------------------------------------------------------------


def words(argv: list[str]) -> int:
    """`board __complete WHAT`: the live words for the script, one a line; no words (exit 0) when they can't be had."""
    if len(argv) != 1 or argv[0] not in WHAT:
        print(f"board: __complete takes one of {', '.join(WHAT)}; the completion script asks it", file=sys.stderr)
        return 2
    try:
        found = _models() if argv[0] == "models" else _live(argv[0])
    except Exception:  # noqa: BLE001 - a TAB never prints an error: the service away, no config, no access
        return 0
    if found:
        sys.stdout.write("".join(f"{word}\n" for word in found))
    return 0


def _live(what: str) -> list[str]:
    """The caller's live bookings' ids, or the fleet's card numbers: one socket round trip."""
    import os
    import time

    from app.client.socket import SocketClient
    from app.config_file import shared_socket

    path = shared_socket(os.environ)
    if path is None:  # no shared service: a personal database is not opened for a TAB
        return []
    client = SocketClient(path, timeout=TIMEOUT_S)
    try:
        if what == "bookings":
            listed = client.call("list", start=int(time.time()), end=None, user=None, mine=True,
                                 include_cancelled=False)
            return [str(b["id"]) for b in listed["bookings"] if type(b.get("id")) is int]
        return [str(c["index"]) for c in client.call("fleet")["cards"] if type(c.get("index")) is int]
    finally:
        client.close()


MAX_MODELS = 2000  # a TAB lists no more than this many files


def _models() -> list[str]:
    """The .gguf files under [llama] model_dirs (the first file of a split model only), absolute paths, sorted.
    A name with a control character (a newline would make it two words) is left out."""
    import os
    import re

    from app.config_file import read_config

    _, raw = read_config(os.environ)
    llama = raw.get("llama")
    dirs = llama.get("model_dirs") if isinstance(llama, dict) else None
    found: list[str] = []
    later_part = re.compile(r"-(?!00001-)\d{5}-of-\d{5}\.gguf$")
    for top in dirs if isinstance(dirs, list) else ():
        if not (isinstance(top, str) and os.path.isabs(top)):
            continue
        for folder, subfolders, names in os.walk(top):
            subfolders[:] = sorted(name for name in subfolders if not name.startswith("."))
            for name in names:
                path = os.path.join(folder, name)
                if name.endswith(".gguf") and path.isprintable() and not later_part.search(name):
                    found.append(path)
                    if len(found) >= MAX_MODELS:
                        return sorted(found)
    return sorted(found)
