"""The alert rules: pure functions from what the service measured (`Inputs`) to what is wrong now (`Finding`s).

The seeds' thresholds (utilisation under 30 % or over 85 % with a growing queue, waits over 30 minutes, VRAM
at or over 90 %, more than 3 OOM or Xid faults a month, 92 °C), and the board's own: a card booked and idle
too long, a squatter (naming its container), a LOST card, a crashed server, a booking about to end (for its holder alone:
`uid`), a card whose power limit drifted from the `[power]` policy.
Thresholds come from `[alerts]` (app.config.AlertSettings). A finding's (rule, subject) is its identity:
the engine (app.alerts.engine) keeps one firing row per identity.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.config import AlertSettings
from app.core.cardstate import LOST, SQUATTED


@dataclass(frozen=True, slots=True)
class Card:
    index: int
    uuid: str
    state: str
    vram_used_mib: int | None = None
    vram_total_mib: int | None = None
    temp_c: int | None = None
    holder: str | None = None
    squatters: tuple[str, ...] = ()
    idle_booked_since: float | None = None  # start of its unbroken BOOKED run (one booking), from the history
    containers: tuple[str, ...] = ()  # the squatters' containers (short ids from their cgroups)
    power_limit_w: float | None = None
    power_policy_w: float | None = None  # [power] limit_w (or the card's override); None: no policy


@dataclass(frozen=True, slots=True)
class Ending:
    booking_id: int
    uid: int
    end: float


@dataclass(frozen=True, slots=True)
class Crash:
    server_id: int
    user: str
    ended_at: float
    what: str = ""


@dataclass(frozen=True, slots=True)
class Inputs:
    now: float
    cards: tuple[Card, ...] = ()
    util_mean: float | None = None  # the fleet's mean utilisation (%) over the window; None: no history
    queued_now: int = 0  # bookings queued to move earlier, now and at the window's start
    queued_before: int = 0
    waits_s: tuple[float, ...] = ()  # start - requested_at of the bookings that started in the window
    faults_month: int = 0  # OOM and Xid faults in the last 30 days
    crashes: tuple[Crash, ...] = ()  # servers that crashed in the last `crashed_min`
    ending: tuple[Ending, ...] = ()  # live bookings whose holder has not been told yet


@dataclass(frozen=True, slots=True)
class Finding:
    rule: str
    subject: str
    message: str
    uid: int | None = None  # for this user alone


RULES = ("util-low", "util-high", "wait", "vram", "faults", "hot", "idle-booked", "squatter", "lost", "crashed",
         "ending", "power-drift")


def evaluate(inputs: Inputs, settings: AlertSettings) -> set[Finding]:
    s, found = settings, set()
    growing = inputs.queued_now > inputs.queued_before
    if inputs.util_mean is not None:
        window = f"{s.window_min:g} min"
        if inputs.util_mean < s.util_low_pct:
            found.add(Finding("util-low", "fleet", f"fleet utilisation {inputs.util_mean:.0f} % over {window}"
                                                   f" (under {s.util_low_pct:g} %)"))
        elif inputs.util_mean > s.util_high_pct and growing:
            found.add(Finding("util-high", "fleet", f"fleet utilisation {inputs.util_mean:.0f} % over {window}"
                                                    f" (over {s.util_high_pct:g} %) and the queue grew from"
                                                    f" {inputs.queued_before} to {inputs.queued_now}"))
    if inputs.waits_s:
        mean = sum(inputs.waits_s) / len(inputs.waits_s)
        if mean > s.wait_min * 60:
            found.add(Finding("wait", "fleet", f"average wait {mean / 60:.0f} min over the last {s.window_min:g} min"
                                               f" ({len(inputs.waits_s)} bookings; over {s.wait_min:g} min)"))
    if inputs.faults_month > s.faults_month:
        found.add(Finding("faults", "fleet", f"{inputs.faults_month} OOM or Xid faults in 30 days"
                                             f" (more than {s.faults_month})"))
    for card in inputs.cards:
        gpu, subject = f"GPU {card.index}", card.uuid
        if card.state == LOST:
            found.add(Finding("lost", subject, f"{gpu} is LOST: the driver no longer sees it"))
            continue
        if card.vram_used_mib is not None and card.vram_total_mib:
            pct = 100 * card.vram_used_mib / card.vram_total_mib
            if pct >= s.vram_pct:
                found.add(Finding("vram", subject, f"{gpu} VRAM at {pct:.0f} % (at or over {s.vram_pct:g} %)"))
        if card.temp_c is not None and card.temp_c >= s.hot_c:
            found.add(Finding("hot", subject, f"{gpu} at {card.temp_c} °C (at or over {s.hot_c:g} °C)"))
        if card.state == SQUATTED:
            who = ", ".join(card.squatters) or "someone"
            whose = f"booked by {card.holder}" if card.holder else "not booked"
            inside = f" in container {', '.join(card.containers)}" if card.containers else ""
            found.add(Finding("squatter", subject, f"{gpu} squatted by {who}{inside} ({whose})"))
        limit, policy = card.power_limit_w, card.power_policy_w
        if limit is not None and policy is not None and abs(limit - policy) >= 1:
            found.add(Finding("power-drift", subject, f"{gpu} power limit {limit:.0f} W, not the policy's {policy:.0f} W"
                                                      " (board power apply sets it)"))
        if card.idle_booked_since is not None and inputs.now - card.idle_booked_since > s.idle_booked_min * 60:
            idle = (inputs.now - card.idle_booked_since) / 60
            found.add(Finding("idle-booked", subject, f"{gpu} booked by {card.holder} and idle for {idle:.0f} min"
                                                      f" (over {s.idle_booked_min:g} min)"))
    for crash in inputs.crashes:
        what = f" ({crash.what})" if crash.what else ""
        found.add(Finding("crashed", f"server:{crash.server_id}", f"server {crash.server_id}{what} of {crash.user}"
                                                                   " crashed"))
    for b in inputs.ending:
        left = b.end - inputs.now
        if 0 < left <= s.ending_min * 60:
            found.add(Finding("ending", f"booking:{b.booking_id}",
                              f"your booking {b.booking_id} ends in {max(1, int(left + 59) // 60)} min", uid=b.uid))
    return found
