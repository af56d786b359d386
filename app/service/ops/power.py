"""The power policy: `power` (any member) shows each card's limit against `[power]`; `power_step` (admins and root)
changes one card, persistence mode or its limit, audited. `board power apply` stages the steps one card at a time.

Changing a card needs what NVML calls root/admin: the driver's own test is CAP_SYS_ADMIN
(kernel-open/common/inc/nv-linux.h: NV_IS_SUSER() is capable(CAP_SYS_ADMIN)). The board-agent unit keeps only
CAP_KILL, so through the service a step fails with NVML's NoPermission until the unit is given CAP_SYS_ADMIN too;
that is the only thing it would be for (docs/health.md). On the simulated fleet a step changes the simulated card.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.identity import Identity
from app.errors import BadInput, NotPermitted
from app.service.rules.audit import audit
from app.service.ops.registry import BOOL, INT, op

if TYPE_CHECKING:
    from app.service import Service

DRIFT_W = 1.0  # NVML keeps milliwatts; a limit within a watt of the policy is the policy


def drifted(limit_w: float | None, policy_w: float | None) -> bool:
    return limit_w is not None and policy_w is not None and abs(limit_w - policy_w) >= DRIFT_W


@op("power")
def power(service: Service, me: Identity) -> dict:
    settings = service.config.power
    cards = []
    for card in service.fleet_snapshot().cards:
        policy = settings.policy_w(card.index)
        cards.append({"index": card.index, "uuid": card.uuid, "limit_w": card.power_limit_w,
                      "default_w": card.power_default_w, "max_w": card.power_max_w, "policy_w": policy,
                      "persistence": card.persistence, "drift": drifted(card.power_limit_w, policy), "lost": card.lost})
    return {"policy_w": settings.limit_w, "pause_s": settings.pause_s, "cards": cards}


@op("power_step", {"card": INT}, {"persistence": BOOL, "limit_w": INT})
def power_step(service: Service, me: Identity, card: int, persistence: bool | None = None,
               limit_w: int | None = None) -> dict:
    """One step of `board power apply`: persistence mode, or one card's limit. Audited, refused or not."""
    if not me.is_admin:
        raise NotPermitted(f"changing a card's power is for admins (group {service.config.admin_group}) and root")
    if (persistence is None) == (limit_w is None):
        raise BadInput("power_step: give persistence or limit_w, one of them")
    cards = service.fleet_snapshot().cards
    if not 0 <= card < len(cards):
        raise BadInput(f"no card {card} (cards are 0-{len(cards) - 1})")
    source = service.fleet.source
    action, details = ("power-persistence", {"card": card, "on": persistence}) if persistence is not None else (
        "power-limit", {"card": card, "from_w": cards[card].power_limit_w, "to_w": limit_w})
    try:
        if persistence is not None:
            source.set_persistence(card, persistence)
        else:
            source.set_power_limit(card, limit_w)
    except Exception as error:  # noqa: BLE001 - NVML's NoPermission, InvalidArgument (out of range), a lost card
        why = str(error) or type(error).__name__
        audit(service, me, action, None, ok=False, details={**details, "refused": why[:200]})
        if "Permission" in type(error).__name__:
            raise NotPermitted(f"card {card}: the driver refused ({why}): the service needs CAP_SYS_ADMIN to change"
                               " power settings") from None
        raise BadInput(f"card {card}: the driver refused ({why})") from None
    audit(service, me, action, None, ok=True, details=details)
    service.fleet.invalidate()  # the next read shows the change
    return details
