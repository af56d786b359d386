"""`board models [--json]`: the team's catalog ([[models]]), each entry as the service sees it now: cold, starting,
ready (and how long idle), draining or failed, with its requests and tokens today (docs/gateway.md#models-on-demand).

Exit codes: 0 ok (a board without a catalog too: it says so), 2 bad input.
"""

from __future__ import annotations

from app.output import EXIT_OK, iso, print_json, table

DESCRIPTION = ("The team's catalog ([[models]] in the service's config, docs/gateway.md#models-on-demand): the models"
               " the gateway starts on free cards when a keyed request names them, and gives back when idle. Each"
               " with its state now (cold, starting, ready on which cards and idle how long, draining, failed;"
               " preloaded inside its preload window), the project it is billed to, how many cards it needs on this"
               " box, and its requests and tokens since midnight.")
NO_CATALOG = ("no models in the catalog: an admin adds [[models]] entries to the service's config"
              " (docs/gateway.md#models-on-demand)")


def add_parser(command) -> None:
    p = command("models", cmd_models, "the team's catalog of models started on demand, and their state now",
                json_flag=True)
    p.description = DESCRIPTION


def cmd_models(ctx) -> int:
    found = ctx.client.call("models")
    if ctx.args.json:
        print_json(models_json(found))
    else:
        print(models_text(found))
    return EXIT_OK


def models_json(found: list[dict]) -> dict:
    """The `models` reply as `--json` shows it: ISO times in the reader's zone (docs/json.md)."""
    return {"models": [{**m, "since": iso(m["since"]), "last_used": iso(m["last_used"])} for m in found]}


def state_text(model: dict) -> str:
    """'ready on cards 2-3, idle 4 min', 'cold', 'starting on cards 2-3', 'draining on cards 2-3', 'failed (server 7:
    board serve logs 7)'; ' (preloaded)' inside its preload window."""
    from app.core.ical import card_ranges
    from app.core.text import relative

    state = model["state"]
    on = f" on cards {card_ranges(model['cards'])}" if model["cards"] else ""
    if state == "ready":
        text = f"ready{on}"
        if model["idle_s"] is not None:  # None: no request since it started
            idle = relative(0, model["idle_s"]).removesuffix(" ago")
            text += f", idle {'under 1 min' if idle == 'now' else idle}"
    elif state in ("starting", "draining"):
        text = f"{state}{on}"
    elif state == "failed":
        server = model["server"]
        text = "failed" + (f" (server {server}: board serve logs {server})" if server is not None else "")
    else:
        text = state
    return text + (" (preloaded)" if model["preloaded"] else "")


def models_text(found: list[dict]) -> str:
    """The table, then each entry's preload window and fallbacks; the catalog's text (the admin's) shown inert."""
    from app.core.text import inert

    if not found:
        return NO_CATALOG
    lines = [["ALIAS", "STATE", "PROJECT", "CARDS NEEDED", "REQUESTS TODAY", "TOKENS TODAY"]]
    for m in found:
        needed = "-" if m["cards_needed"] is None else str(m["cards_needed"])
        lines.append([inert(m["alias"], 40), inert(state_text(m), 80), inert(m["project"] or "-", 40), needed,
                      str(m["requests_today"]), str(m["tokens_today"])])
    out = [table(lines)]
    for m in found:
        alias = inert(m["alias"], 40)
        if m["preload"]:
            out.append(f"{alias} is kept warm {inert(m['preload']['days'], 40)} {inert(m['preload']['hours'], 40)}")
        if m["fallbacks"]:
            out.append(f"{alias} falls back to {', '.join(inert(f, 40) for f in m['fallbacks'])}")
    return "\n".join(out)
