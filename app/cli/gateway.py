"""`board key new|list|revoke`, `board usage` and `board gateway` (the team's OpenAI-compatible front door).

Keys are issued to whoever the kernel says is asking (no master key); admins may issue them for service accounts
(--user). `board key new` prints the key once: only its hash is kept. docs/gateway.md has the whole path.
Exit codes: 0 ok, 2 bad input or no such key, 3 already revoked, 4 not permitted.
"""

from __future__ import annotations

import argparse

from app.cli.arguments import daemon
from app.errors import BadInput
from app.output import EXIT_OK, iso, print_json, table

KEY_DESCRIPTION = ("API keys for the gateway ([gateway] listen): each key is yours (who the kernel says you are),"
                   " can be limited to some models (--models) and has a class that orders its requests when a model is"
                   " busy (online before batch before the rest). The key is printed once; board keeps only its hash.")


def _age(text: str) -> int:
    from app.report.compute import parse_since

    try:
        return parse_since(text)
    except BadInput as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _expires(text: str) -> int:
    from app.core.timeparse import parse_duration

    try:
        return int(parse_duration(text).total_seconds())
    except BadInput as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_parser(command, common) -> None:
    from app.config import CLASSES

    p = command("key", cmd_key, "API keys for the gateway: new, list, revoke")
    p.description = KEY_DESCRIPTION
    actions = p.add_subparsers(title="key commands", metavar="ACTION")
    a = actions.add_parser("new", help="a new key, printed once", description=KEY_DESCRIPTION, parents=[common])
    a.set_defaults(handler=cmd_key_new)
    a.add_argument("--name", default="", help="a name to tell your keys apart (a laptop, a project)")
    a.add_argument("--models", metavar="A,B", help="only these model aliases (default: every model)")
    a.add_argument("--class", dest="klass", choices=CLASSES,
                   help="its requests' priority, one you may use ([classes]); default: the usual class of your"
                        " bookings, else batch")
    a.add_argument("--expires", type=_expires, metavar="AGE", help="it stops working after this: 90d, 12h")
    a.add_argument("--user", metavar="NAME", help="admins: a key for this account (a service account)")
    a.add_argument("--project", metavar="NAME",
                   help="the project its requests count against ([[projects]]); default: the holder's only one")
    a.add_argument("--json", action="store_true", help="print JSON")
    a = actions.add_parser("list", help="your keys (fingerprints, never the keys)", parents=[common])
    a.set_defaults(handler=cmd_key_list)
    a.add_argument("--all", action="store_true", help="revoked and expired keys too; for admins everyone's")
    a.add_argument("--json", action="store_true", help="print JSON")
    a = actions.add_parser("revoke", help="stop a key (within seconds)", parents=[common])
    a.set_defaults(handler=cmd_key_revoke)
    a.add_argument("id", type=int, metavar="ID")
    a.add_argument("--json", action="store_true", help="print JSON")

    p = command("usage", cmd_usage, "the gateway's requests and tokens per user, key, model or project",
                json_flag=True)
    p.add_argument("--since", type=_age, default=7 * 86400, metavar="AGE", help="how far back: 12h, 7d (default 7d)")
    p.add_argument("--by", choices=("user", "key", "model", "project"), default="user",
                   help="group by (default user; project on a board with [[projects]])")

    p = daemon(command("gateway", cmd_gateway, "run the OpenAI-compatible gateway (its unit runs it as board-gateway)"))
    p.add_argument("--listen", metavar="HOST:PORT", help="instead of [gateway] listen")


def cmd_key(ctx) -> int:
    raise BadInput("say which key action: board key new | list | revoke ID")


def _key_json(key: dict) -> dict:
    return {**key, "expires": iso(key.get("expires")), **({"created": iso(key["created"])} if "created" in key else {}),
            **({"revoked": iso(key["revoked"])} if "revoked" in key else {})}


def cmd_key_new(ctx) -> int:
    import time

    from app.core.keys import parse_models

    args = ctx.args
    try:
        models = parse_models(args.models)
    except ValueError as error:
        raise BadInput(f"--models: {error}") from None
    expires = int(time.time()) + args.expires if args.expires else None
    key = ctx.client.call("key_new", name=args.name, models=models, expires=expires, user=args.user,
                          project=args.project, **{"class": args.klass})
    if args.json:
        print_json(_key_json(key))
        return EXIT_OK
    print(key["key"])
    project = f", project {key['project']}" if key.get("project") else ""
    print(f"key {key['id']} ({key['fingerprint']}) for {key['user']}{project}, class {key['class']},"
          f" models: {', '.join(key['models']) if key['models'] else 'all'},"
          f" expires: {iso(key['expires']) or 'never'}. It is shown only now: keep it.")
    return EXIT_OK


def cmd_key_list(ctx) -> int:
    from app.core.text import inert

    keys = ctx.client.call("key_list", all=ctx.args.all)
    if ctx.args.json:
        print_json([_key_json(k) for k in keys])
        return EXIT_OK
    if not keys:
        print("no keys; make one with: board key new")
        return EXIT_OK
    projects = any("project" in k for k in keys)  # the column only where some key is for a named project
    rows = [["ID", "FINGERPRINT", "USER", *(["PROJECT"] if projects else []), "NAME", "CLASS", "MODELS", "EXPIRES",
             "REVOKED"]]
    for k in keys:
        rows.append([str(k["id"]), k["fingerprint"], inert(k["user"], 32), *([k.get("project", "")] if projects else []),
                     inert(k["name"], 40), k["class"], inert(",".join(k["models"]), 60) if k["models"] else "all",
                     iso(k["expires"]) or "never", iso(k["revoked"]) or ""])
    print(table(rows))
    return EXIT_OK


def cmd_key_revoke(ctx) -> int:
    key = ctx.client.call("key_revoke", id=ctx.args.id)
    if ctx.args.json:
        print_json(_key_json(key))
    else:
        print(f"key {key['id']} ({key['fingerprint']}) revoked: the gateway refuses it within seconds")
    return EXIT_OK


def cmd_usage(ctx) -> int:
    import time

    from app.core.text import inert

    doc = ctx.client.call("usage", since=max(0, int(time.time()) - ctx.args.since), by=ctx.args.by)
    if ctx.args.json:
        print_json({"since": iso(doc["since"]), "by": doc["by"], "rows": doc["rows"]})
        return EXIT_OK
    by_project = doc["by"] == "project"  # a column of its own, first: the others are summed over
    rows = [["PROJECT"] * by_project + ["USER", "KEY", "MODEL", "REQUESTS", "PROMPT", "COMPLETION", "ERRORS"]]
    for r in doc["rows"]:
        rows.append([inert(r["project"], 40) or "(none)"] * by_project
                    + [inert(r["user"], 32) or "*", r["key"] or "*", inert(r["model"], 60) or "*", str(r["requests"]),
                       str(r["prompt_tokens"]), str(r["completion_tokens"]), str(r["errors"])])
    print(table(rows) if len(rows) > 1 else "no requests through the gateway in that time")
    return EXIT_OK


def cmd_gateway(ctx) -> int:
    from app.cli.logs import start_logging  # start-up: only the daemons load logging
    from app.gateway.server import run_gateway  # start-up: only the gateway loads aiohttp

    start_logging(ctx.environ)  # no cut: a logged request body (log_bodies) is up to 4096 bytes
    return run_gateway(ctx.config, listen=ctx.args.listen)
