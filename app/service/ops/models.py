"""The catalog's operations ([[models]], app.service.rules.ondemand): model_demand and models_touch, the gateway's
own (its account, [gateway] user, or root: they book and extend as the runner account), and models, which any member
reads (board models)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, TypedDict

import msgspec

from app.core.identity import Identity
from app.service.ops.gateway import _gateway_only
from app.service.ops.registry import NoArguments, Request, op
from app.service.rules.ondemand import ModelDemand, ModelWire, models_view, touch, wake

if TYPE_CHECKING:
    from app.service import Service

Alias = Annotated[str, msgspec.Meta(min_length=1, max_length=200, description="a catalog alias ([[models]])")]


class Demand(Request, frozen=True):
    alias: Alias


@op("model_demand", Demand)
def model_demand(service: Service, me: Identity, request: Demand) -> ModelDemand:
    """The alias's server starting or ready (booked now on free cards when it is cold), or why not and when."""
    _gateway_only(service, me, "model_demand")
    return wake(service, request.alias)


class Touch(Request, frozen=True):
    aliases: Annotated[list[Alias], msgspec.Meta(max_length=1000)]


class Touched(TypedDict):
    extended: dict[str, int]  # alias -> its booking's end now


@op("models_touch", Touch)
def models_touch(service: Service, me: Identity, request: Touch) -> Touched:
    """The aliases the gateway used since its last flush: each live on-demand booking's lease grows."""
    _gateway_only(service, me, "models_touch")
    return {"extended": touch(service, request.aliases)}


@op("models", NoArguments)
def models(service: Service, me: Identity, request: NoArguments) -> list[ModelWire]:
    """Each catalog entry, in catalog order, with its state, cards and use today (board models)."""
    return models_view(service, me)
