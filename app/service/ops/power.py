"""The power policy: `power` (any member) shows each card's limit against `[power]`; `power_step` (admins and root)
changes one card, persistence mode or its limit, audited. `board power apply` stages the steps one card at a time.

Changing a card needs what NVML calls root/admin: the driver's own test is CAP_SYS_ADMIN
(kernel-open/common/inc/nv-linux.h: NV_IS_SUSER() is capable(CAP_SYS_ADMIN)). The board-agent unit keeps only
CAP_KILL, so through the service a step fails with NVML's NoPermission until the unit is given CAP_SYS_ADMIN too;
that is the only thing it would be for (docs/health.md). On the simulated fleet a step changes the simulated card.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Protocol, TypedDict, cast

from app.core.hardware import drifted
from app.core.identity import Identity
from app.errors import BadInput, NotPermitted
from app.service.ops.registry import Int, NoArguments, Request, op
from app.service.rules.audit import audit

if TYPE_CHECKING:
    from app.service import Service

class PowerControl(Protocol):
    """What NVML's source and the simulated one add to a GpuSource: they change a card."""

    def set_persistence(self, index: int, on: bool) -> None: ...

    def set_power_limit(self, index: int, watts: float) -> None: ...


class CardPower(TypedDict):
    index: int
    uuid: str
    limit_w: float | None  # None: the driver does not say
    default_w: float | None
    max_w: float | None
    policy_w: float | None  # [power]'s limit for this card; None: no policy
    persistence: bool | None
    drift: bool  # the limit is a watt or more off the policy
    lost: bool


class PowerReply(TypedDict):
    policy_w: float | None
    pause_s: float
    cards: list[CardPower]


@op("power", NoArguments)
def power(service: Service, me: Identity, request: NoArguments) -> PowerReply:
    settings = service.config.power
    cards: list[CardPower] = []
    for card in service.fleet_snapshot().cards:
        policy = settings.policy_w(card.index)
        cards.append({"index": card.index, "uuid": card.uuid, "limit_w": card.power_limit_w,
                      "default_w": card.power_default_w, "max_w": card.power_max_w, "policy_w": policy,
                      "persistence": card.persistence, "drift": drifted(card.power_limit_w, policy), "lost": card.lost})
    return {"policy_w": settings.limit_w, "pause_s": settings.pause_s, "cards": cards}


class PowerStep(Request, frozen=True):
    """One card's persistence mode or its limit: one of the two."""
    card: Int
    persistence: bool | None = None
    limit_w: Int | None = None


class PowerStepReply(TypedDict, total=False):
    """What changed, as audited: {card, on} for persistence mode, {card, from_w, to_w} for a limit."""
    card: int
    on: bool
    from_w: float | None
    to_w: int


@op("power_step", PowerStep)
def power_step(service: Service, me: Identity, request: PowerStep) -> PowerStepReply:
    """One step of `board power apply`: persistence mode, or one card's limit. Audited, refused or not."""
    card, persistence, limit_w = request.card, request.persistence, request.limit_w
    if not me.is_admin:
        raise NotPermitted(f"changing a card's power is for admins (group {service.config.admin_group}) and root")
    if (persistence is None) == (limit_w is None):
        raise BadInput("power_step: give persistence or limit_w, one of them")
    cards = service.fleet_snapshot().cards
    if not 0 <= card < len(cards):
        raise BadInput(f"no card {card} (cards are 0-{len(cards) - 1})")
    # Another source has neither method: its AttributeError is refused below, as a driver's refusal is.
    source = cast(PowerControl, service.fleet.source)
    if persistence is not None:
        action, details = "power-persistence", PowerStepReply(card=card, on=persistence)
        step = partial(source.set_persistence, card, persistence)
    else:
        assert limit_w is not None  # one of the two, checked above
        action, details = "power-limit", PowerStepReply(card=card, from_w=cards[card].power_limit_w, to_w=limit_w)
        step = partial(source.set_power_limit, card, limit_w)
    try:
        step()
    except Exception as error:  # noqa: BLE001 - NVML's NoPermission, InvalidArgument (out of range), a lost card
        why = str(error) or type(error).__name__
        audit(service, me, action, None, ok=False, details={**details, "refused": why[:200]})
        if "Permission" in type(error).__name__:
            raise NotPermitted(f"card {card}: the driver refused ({why}): the service needs CAP_SYS_ADMIN to change"
                               " power settings") from None
        raise BadInput(f"card {card}: the driver refused ({why})") from None
    audit(service, me, action, None, ok=True, details=dict(details))
    service.fleet.invalidate()  # the next read shows the change
    return details
