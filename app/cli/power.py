"""`board power [--json]`: each card's power limit against `[power]`; `board power apply [--dry-run]`: persistence
mode on, then each card's limit, one card at a time with a pause, as the seeds power up eight cards."""

from __future__ import annotations

import time

from app.errors import BadInput
from app.output import EXIT_OK, print_json, table


def add_parser(command, common) -> None:
    p = command("power", cmd_power, "each card's power limit, default and max against the [power] policy; drift"
                " flagged", json_flag=True)
    sub = p.add_subparsers(metavar="ACTION")
    apply = sub.add_parser("apply", parents=[common], help="admins: persistence mode on, then each card's limit to the"
                           " policy, one card at a time with a pause, each step printed and audited",
                           description="Persistence mode on, then each card's power limit to the [power] policy, one"
                           " card at a time with [power] pause_s between cards (the seeds' staged power-on).")
    apply.set_defaults(handler=cmd_apply, json=False)
    apply.add_argument("--dry-run", action="store_true", help="print the steps, change nothing")


def _watts(value) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def cmd_power(ctx) -> int:
    found = ctx.client.call("power")
    if ctx.args.json:
        print_json(found)
        return EXIT_OK
    lines = [["#", "LIMIT W", "DEFAULT W", "MAX W", "POLICY W", "PERSISTENCE", ""]]
    for c in found["cards"]:
        persistence = {True: "on", False: "off", None: "n/a"}[c["persistence"]]
        flag = "LOST" if c["lost"] else "DRIFT" if c["drift"] else ""
        lines.append([str(c["index"]), _watts(c["limit_w"]), _watts(c["default_w"]), _watts(c["max_w"]),
                      _watts(c["policy_w"]) if c["policy_w"] is not None else "-", persistence, flag])
    print(table(lines))
    if found["policy_w"] is None and not any(c["policy_w"] for c in found["cards"]):
        print("no [power] limit_w in the config: no policy to hold the cards to (the team's field report, seed 003,"
              " runs its 575 W cards at 500 W: about 5 % less decode speed, no more cards off the bus)")
    drift = [c["index"] for c in found["cards"] if c["drift"]]
    if drift:
        print(f"cards {','.join(map(str, drift))} differ from the policy: board power apply (as an admin) sets them")
    return EXIT_OK


def plan(found: dict) -> list[tuple[int, list[dict]]]:
    """Per card, the steps that bring it to the policy: persistence mode on, then its limit."""
    steps = []
    for c in found["cards"]:
        if c["lost"]:
            continue
        policy = c["policy_w"]
        if policy is not None and c["max_w"] is not None and policy > c["max_w"]:
            raise BadInput(f"card {c['index']}: the policy's {policy:g} W is over the card's maximum {c['max_w']:g} W;"
                           " lower [power] limit_w")
        card_steps = []
        if c["persistence"] is not True:
            card_steps.append({"persistence": True})
        if policy is not None and c["drift"]:
            card_steps.append({"limit_w": round(policy), "from_w": c["limit_w"]})
        if card_steps:
            steps.append((c["index"], card_steps))
    return steps


def describe(card: int, step: dict) -> str:
    if "persistence" in step:
        return f"card {card}: persistence mode on (nvidia-smi -i {card} -pm 1)"
    watts = step["limit_w"]
    return f"card {card}: power limit {_watts(step['from_w'])} W -> {watts} W (nvidia-smi -i {card} -pl {watts})"


def cmd_apply(ctx) -> int:
    found = ctx.client.call("power")
    if found["policy_w"] is None and not any(c["policy_w"] is not None for c in found["cards"]):
        raise BadInput("no [power] limit_w in the config: nothing to apply (e.g. [power] limit_w = 500)")
    steps = plan(found)
    if not steps:
        print("every card already runs at the policy with persistence mode on: nothing to do")
        return EXIT_OK
    pause = found["pause_s"]
    for n, (card, card_steps) in enumerate(steps):
        if n and not ctx.args.dry_run:
            print(f"pause {pause:g} s", flush=True)
            time.sleep(pause)  # the seeds' staged power-on: one card, then the next, never all at once
        for step in card_steps:
            if ctx.args.dry_run:
                print(f"would set {describe(card, step)}")
                continue
            change = {k: v for k, v in step.items() if k != "from_w"}
            ctx.client.call("power_step", card=card, **change)
            print(f"set {describe(card, step)}", flush=True)
    if ctx.args.dry_run:
        print(f"dry run: nothing changed ({len(steps)} cards, {pause:g} s apart)")
    return EXIT_OK
