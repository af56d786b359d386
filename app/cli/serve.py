"""`board serve start|stop|list|logs|key`: llama-servers on booked cards.

The handlers import app.llama only when run, so parsing stays fast and nothing here imports Textual.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from app.cli.arguments import booking_id
from app.errors import BadInput
from app.output import iso, print_json, table

RECENT_S = 24 * 3600  # `serve list` shows servers that ended within this long, besides the live ones


def server_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value < 2**63:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a server number; 'board serve list' shows them")
    return value


def _start_options(a: argparse.ArgumentParser) -> None:
    a.add_argument("--model", "-m", help="the .gguf model file (default: the booking's request)")
    a.add_argument("--ctx", type=int, help="total context, shared by all slots (llama-server -c; default 4096)")
    a.add_argument("--parallel", type=int, help="slots, i.e. concurrent requests (llama-server -np; default 1)")
    a.add_argument("--port", type=int, help="a port from the configured range (default: the first free one)")
    a.add_argument("--split-mode", choices=("layer", "row"), default="layer",
                   help="how to split across cards: layer (default; right for PCIe) or row")
    a.add_argument("--tensor-split", metavar="N0,N1,...", help="share of the model per card, in card order")
    a.add_argument("--metrics", action="store_true", help="enable /metrics (tokens/s in the TUI)")
    a.add_argument("--alias", help="the model name the API reports (default: the file name)")
    a.add_argument("--host", help="listen address (default 127.0.0.1; others only if the config allows them)")
    a.add_argument("--no-wait", action="store_true", help="return right after launch instead of waiting for ready")
    a.add_argument("--cache-type-k", help="K cache type: f16 (default), q8_0, q4_0, ...")
    a.add_argument("--cache-type-v", help="V cache type (a quantised one needs flash attention)")
    a.add_argument("--flash-attn", choices=("on", "off"), help="flash attention (default on)")
    a.add_argument("--force", action="store_true",
                   help="start even if board's estimate says it does not fit the booked cards (audited)")


class _OptionsParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise BadInput(f"serve start: {message}; llama-server's own arguments go after --")


def _split_extra(args: argparse.Namespace) -> list[str]:
    """`serve start`'s options may come after the booking id, where argparse's REMAINDER swallows them:
    parse those here, and return what follows `--` (the llama-server arguments)."""
    rest = list(args.extra)
    if "--" in rest:
        head, extra = rest[:rest.index("--")], rest[rest.index("--") + 1:]
    elif rest and rest[0].split("=", 1)[0] not in _START_FLAGS:
        head, extra = [], rest  # argparse already dropped a `--` right after the booking id
    else:
        head, extra = rest, []
    if head:
        parser = _OptionsParser(prog="board serve start", add_help=False)
        _start_options(parser)
        _shared_options(parser)
        parser.parse_args(head, namespace=args)
    return extra


def _shared_options(parser: argparse.ArgumentParser) -> None:
    """board's shared options and --json, when they come after the booking id."""
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    parser.add_argument("--db", default=argparse.SUPPRESS)
    parser.add_argument("--demo", action="store_true", default=argparse.SUPPRESS)
    parser.add_argument("--scenario", default=argparse.SUPPRESS)


def _flags() -> frozenset[str]:
    parser = argparse.ArgumentParser(add_help=False)
    _start_options(parser)
    _shared_options(parser)
    return frozenset(o for action in parser._actions for o in action.option_strings)


_START_FLAGS = _flags()


def add_parser(command, common) -> None:
    """Add `serve` and its actions. `command` is build_parser's helper; `common` its shared options."""
    p = command("serve", cmd_serve, "llama-servers on your booked cards: start, stop, list, logs")
    actions = p.add_subparsers(title="serve commands", metavar="ACTION")

    def action(name: str, handler, help: str, json_flag: bool = False) -> argparse.ArgumentParser:
        a = actions.add_parser(name, help=help, description=help, parents=[common])
        a.set_defaults(handler=handler)
        if json_flag:
            a.add_argument("--json", action="store_true", help="print JSON")
        return a

    a = action("start", cmd_start, "start llama-server on a booking's cards (you hold it, it is active now)",
               json_flag=True)
    a.add_argument("booking", type=booking_id, help="booking id")
    _start_options(a)
    a.add_argument("extra", nargs=argparse.REMAINDER, help="-- extra llama-server arguments")

    a = action("stop", cmd_stop, "stop a server (SIGTERM to its process group, SIGKILL after 10 s)", json_flag=True)
    a.add_argument("id", type=server_id, help="server id")

    a = action("list", cmd_list, "servers: live ones and those that ended in the last day (MEM: the memory"
               " llama.cpp allocated at load / board's estimate)", json_flag=True)
    a.add_argument("--all", action="store_true", help="every server ever started")
    a.add_argument("--mine", action="store_true", help="only mine")

    a = action("logs", cmd_logs, "a server's log")
    a.add_argument("id", type=server_id, help="server id")
    a.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the server ends")
    a.add_argument("-n", "--lines", type=int, default=50, help="how many lines from the end (default 50)")

    a = action("plan", cmd_plan, "a server that follows the calendar: started by the runner at each start of a"
               " booking (or of every occurrence of a series), with nobody logged in, and stopped at its end",
               json_flag=True)
    a.add_argument("booking", type=booking_id, nargs="?", help="booking id (or --series)")
    a.add_argument("--series", type=booking_id, metavar="ID", help="every occurrence of this series")
    a.add_argument("--list", action="store_true", help="the planned servers and their next start")
    a.add_argument("--cancel", type=server_id, metavar="PLAN", help="cancel a plan (no further starts)")
    a.add_argument("--model", "-m", help="the .gguf model file, under [llama] model_dirs (default: the booking's request)")
    a.add_argument("--ctx", type=int, help="total context, shared by all slots (llama-server -c)")
    a.add_argument("--parallel", type=int, help="slots, i.e. concurrent requests (llama-server -np)")
    a.add_argument("--alias", help="the model name clients ask for (default: the file name)")
    a.add_argument("--split-mode", choices=("layer", "row"), help="how to split across cards (default layer)")
    a.add_argument("--metrics", action="store_true", help="enable llama-server's /metrics")
    a.add_argument("--cache-type-k", help="K cache type: f16 (default), q8_0, q4_0, ...")
    a.add_argument("--cache-type-v", help="V cache type (a quantised one needs flash attention)")
    a.add_argument("--flash-attn", choices=("on", "off"), help="flash attention (default on)")
    a.add_argument("--force", action="store_true", help="plan it even if board's estimate says it does not fit")
    a.add_argument("--project", metavar="NAME", help="the project it serves: its booking's, the only one it may name")

    a = action("key", cmd_key, "a server's own API key (its holder and admins): send it as 'Authorization: Bearer KEY'",
               json_flag=True)
    a.add_argument("id", type=server_id, help="server id")


# -- plumbing ----------------------------------------------------------------------------------
# Everything that touches the database goes through `ctx.client` (the service in process, or its
# socket); launching and waiting are app.llama.launch, shared with the TUI.


def server_json(server) -> dict[str, Any]:
    return {
        "id": server.id,
        "booking_id": server.booking_id,
        "user": server.user,
        "cards": list(server.cards),
        "card_uuids": list(server.card_uuids),
        "model": server.model,
        "alias": server.alias,
        "host": server.host,
        "port": server.port,
        "url": server.url,
        "pid": server.pid,
        "pgid": server.pgid,
        "supervisor_pid": server.supervisor_pid,
        "state": server.state,
        "started": iso(server.created_at),
        "ready": iso(server.ready_at),
        "ended": iso(server.ended_at),
        "ctx": server.ctx,
        "parallel": server.parallel,
        "split_mode": server.split_mode,
        "metrics": server.metrics,
        "log": server.log_path,
        "exit_code": server.exit_code,
        "exit_signal": server.exit_signal,
        "exit": server.exit_text,
        "reason": server.reason,
        "log_tail": list(server.log_tail),
        "cmdline": list(server.cmdline),
        "estimate": server.estimate,
        "measured": server.measured,
    }


def memory_cell(server) -> str:
    """MEM: what llama.cpp allocated over all its buffers / board's estimate over all cards, e.g. "9.8/10.2G",
    in GiB, or in MiB ("106/624M") while both are under a GiB; "-" for a figure that is not known."""
    measured = server.measured_memory
    used = measured.total_mib if measured is not None else None
    per_card = server.estimate_per_card
    planned = sum(per_card) if per_card is not None else None
    if used is None and planned is None:
        return "-"
    if max(x for x in (used, planned) if x is not None) >= 1024:
        shown = ["-" if x is None else f"{x / 1024:.1f}" for x in (used, planned)]
        return f"{shown[0]}/{shown[1]}G"
    shown = ["-" if x is None else f"{x:.0f}" for x in (used, planned)]
    return f"{shown[0]}/{shown[1]}M"


def _print_tail(lines, limit: int = 20) -> None:
    from app.core.text import inert

    for line in list(lines)[-limit:]:
        print(f"  | {inert(line.replace(chr(9), '    '), 300)}", file=sys.stderr)


# -- handlers ----------------------------------------------------------------------------------


def cmd_serve(ctx) -> int:
    raise BadInput("say what to do: board serve start|stop|list|logs|key (see 'board serve --help')")


def cmd_start(ctx) -> int:
    from app.core.text import inert
    from app.llama import launch
    from app.llama.launch import ServerEnded
    from app.fit.request import limits

    args = ctx.args
    extra = _split_extra(args)
    client = ctx.client
    server, grant = launch.start(
        client, args.booking, socket_path=getattr(client, "path", None), environ=ctx.environ,
        model=args.model, ctx=args.ctx, parallel=args.parallel, port=args.port, split_mode=args.split_mode,
        tensor_split=args.tensor_split, metrics=args.metrics or None, alias=args.alias, host=args.host,
        extra=extra or None, cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v, flash_attn=args.flash_attn,
        fit_limits=limits(ctx.config), force=args.force,
    )
    cards = ",".join(map(str, server.cards))
    where = f"server {server.id} ({inert(server.alias or '', 40)}) on cards {cards}, {server.url}"
    if args.no_wait:
        if args.json:
            print_json(server_json(server))
        else:
            print(f"starting {where}; 'board serve list' shows when it is ready, 'board serve logs {server.id} -f' its log")
        return 0
    print(f"starting {where} ", end="", file=sys.stderr, flush=True)
    began = time.monotonic()
    shown = [0]

    def progress(elapsed: float) -> None:
        while shown[0] < int(elapsed):
            shown[0] += 1
            print("." if shown[0] % 10 else f"{shown[0]}s", end="", file=sys.stderr, flush=True)

    try:
        server = launch.wait_ready(client, server, timeout=float(grant["ready_timeout_s"]) + 15, progress=progress)
    except ServerEnded as ended:
        print(" " + ended.server.state, file=sys.stderr)
        _print_tail(ended.server.log_tail or client.call("serve_logs", id=server.id, lines=20)["lines"])
        raise
    except KeyboardInterrupt:
        print(f"\nserver {server.id} keeps starting in the background; 'board serve list' shows it,"
              f" 'board serve stop {server.id}' stops it", file=sys.stderr)
        return 130
    except BaseException:
        print(file=sys.stderr)
        raise
    print(f" ready in {time.monotonic() - began:.1f} s", file=sys.stderr)
    if args.json:
        print_json(server_json(server))
    else:
        print(f"server {server.id} ready: {server.url}  (model {inert(server.alias or '', 40)}, cards {cards};"
              f" stop with 'board serve stop {server.id}')")
    return 0


def cmd_stop(ctx) -> int:
    from app.llama import launch

    client = ctx.client
    before = launch.get(client, ctx.args.id)
    started = time.monotonic()
    server = launch.stop(client, ctx.args.id)
    took = time.monotonic() - started
    if ctx.args.json:
        print_json(server_json(server))
        return 0
    if not before.live:
        print(f"server {server.id} had already ended: {server.state}"
              + (f" ({server.exit_text})" if server.exit_text else ""))
    elif server.state == "stopping":
        print(f"server {server.id} is stopping; its supervisor finishes the job ('board serve list' shows it)")
    elif server.state == "stopped":
        print(f"stopped server {server.id} in {took:.1f} s" + (f" ({server.exit_text})" if server.exit_text else ""))
    else:
        print(f"server {server.id} {server.state}" + (f": {server.reason}" if server.reason else ""))
    return 0


def cmd_list(ctx) -> int:
    from app.core.text import format_elapsed, inert
    from app.llama.rows import server_from_wire

    args = ctx.args
    found = [server_from_wire(s) for s in ctx.client.call(
        "serve_list", all=True, user=ctx.me.name if args.mine else None)]
    now = time.time()
    if not args.all:
        found = [s for s in found if s.live or (s.ended_at or s.created_at) >= now - RECENT_S]
    planned = [p for p in ctx.client.call("serve_plans") if p["next_start"] is not None
               and (not args.mine or p["user"] == ctx.me.name)]
    if args.json:
        print_json({"servers": [server_json(s) for s in found], "planned": planned})
        return 0
    if not found:
        print("no servers" + ("" if args.all else " now or in the last day; --all shows older ones"))
        _print_planned(planned, now)
        return 0
    lines = [["ID", "STATE", "USER", "BOOKING", "CARDS", "PORT", "PID", "UPTIME", "MEM", "MODEL", "NOTE"]]
    for s in found:
        if s.live:
            uptime = format_elapsed(now - (s.ready_at or s.created_at))
            note = s.url if s.state == "ready" else (s.reason or "")
        else:
            uptime = "-"
            note = "; ".join(x for x in (s.exit_text, s.reason) if x)
        lines.append([str(s.id), s.state, inert(s.user, 12), str(s.booking_id), ",".join(map(str, s.cards)),
                      str(s.port), str(s.pid or "-"), uptime, memory_cell(s), inert(s.alias or s.model, 24),
                      inert(note, 60)])
    print(table(lines))
    _print_planned(planned, now)
    return 0


def _print_planned(planned: list[dict], now: float) -> None:
    """The planned servers' next starts, under the table ('board serve plan --list' has them all)."""
    from app.core.text import format_when, inert

    for p in planned:
        print(f"planned {p['id']}: {inert(p['alias'], 40)} ({inert(p['user'], 12)}) starts"
              f" {format_when(p['next_start'], now)} (booking {p['next_booking']})")


def cmd_plan(ctx) -> int:
    from app.core.text import format_time, format_when, inert
    from app.fit.request import limits
    from app.llama import launch

    args, client, now = ctx.args, ctx.client, time.time()
    if args.list:
        plans = client.call("serve_plans")
        if args.json:
            print_json({"plans": plans})
        elif not plans:
            print("no planned servers; 'board serve plan BOOKING --model M' plans one")
        else:
            lines = [["PLAN", "USER", "FOR", "ALIAS", "MODEL", "NEXT START"]]
            for p in plans:
                what = f"booking {p['booking']}" if p["booking"] is not None else f"series {p['series']}"
                lines.append([str(p["id"]), inert(p["user"], 12), what, inert(p["alias"], 24),
                              inert((p["model"] or "").rsplit("/", 1)[-1], 32),
                              f"{format_time(p['next_start'], now)} (booking {p['next_booking']})"
                              if p["next_start"] else "-"])
            print(table(lines))
            for p in plans:  # a start the service refused leaves no server row: say why here
                if refused := p.get("refused"):
                    print(f"plan {p['id']}: not started for booking {refused['booking']}: {inert(refused['error'], 200)}")
        return 0
    if args.cancel is not None:
        plan = client.call("serve_plan_cancel", id=args.cancel)
        if args.json:
            print_json(plan)
        else:
            print(f"cancelled planned server {plan['id']} ({inert(plan['alias'], 40)})")
        return 0
    if (args.booking is None) == (args.series is None):
        raise BadInput("serve plan: give a booking or --series ID (or --list, --cancel PLAN)")
    plan = launch.plan(client, booking=args.booking, series=args.series, fit_limits=limits(ctx.config),
                       force=args.force, model=args.model, ctx=args.ctx, parallel=args.parallel, alias=args.alias,
                       split_mode=args.split_mode, metrics=args.metrics or None, cache_type_k=args.cache_type_k,
                       cache_type_v=args.cache_type_v, flash_attn=args.flash_attn, project=args.project)
    if args.json:
        print_json(plan)
    else:
        when = f"next start {format_when(plan['next_start'], now)}" if plan["next_start"] else "no occurrence ahead"
        print(f"planned server {plan['id']}: {inert(plan['alias'], 40)}, {when}; the runner starts it")
    return 0


def cmd_key(ctx) -> int:
    found = ctx.client.call("serve_key", id=ctx.args.id)
    if ctx.args.json:
        print_json(found)
    else:
        print(found["key"])
    return 0


def cmd_logs(ctx) -> int:
    """The owner reads the log file its own supervisor wrote; anyone else gets the lines the service holds."""
    from app.core.text import inert
    from app.llama.logs import follow, tail

    args = ctx.args
    if args.lines < 0:
        raise BadInput("--lines must be 0 or more")
    client = ctx.client
    found = client.call("serve_logs", id=args.id, lines=args.lines)
    path = found.get("log")
    if path is not None:
        try:
            open(path, "rb").close()
        except OSError:
            path = None  # written elsewhere (another host's home?): what the service holds

    def show(line: str) -> None:
        print(inert(line.replace("\t", "    ")))

    def ended() -> bool:
        try:
            return client.call("serve_get", id=args.id)["state"] not in ("starting", "ready", "stopping")
        except BadInput:
            return True

    try:
        if path is None:
            seen = found["lines"]
            for line in seen:
                show(line)
            if not seen and args.lines:  # never a silent empty answer
                print(f"server {args.id} is {found['state']}: the service holds no log lines for it"
                      f" {'yet' if found['live'] else '(its supervisor sent none)'}", file=sys.stderr)
            while args.follow and found["live"]:
                time.sleep(1.0)
                found = client.call("serve_logs", id=args.id, lines=500)
                for line in _new_lines(seen, found["lines"]):
                    show(line)
                seen = found["lines"]
                sys.stdout.flush()
        elif not args.follow:
            lines = tail(path, args.lines, max_bytes=max(64 * 1024, args.lines * 512))
            for line in lines:
                show(line)
            if not lines and args.lines:
                print(f"server {args.id} is {found['state']}: its log {path} is empty", file=sys.stderr)
        else:
            for line in follow(path, start_lines=args.lines, until=ended):
                show(line)
                sys.stdout.flush()
    except KeyboardInterrupt:
        return 0
    return 0


def _new_lines(before: list[str], after: list[str]) -> list[str]:
    """The lines of `after` not already in `before`: both are windows onto one growing log."""
    for overlap in range(min(len(before), len(after)), 0, -1):
        if before[-overlap:] == after[:overlap]:
            return after[overlap:]
    return after
