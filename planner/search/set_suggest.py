"""What would make a set fit (`fitplan plan-set` on a set that does not): for the model that did not fit,
the largest context per slot that plans within what it was left, a q8_0 KV cache, fewer slots; and any
resident model moved on demand (it then swaps with the other on-demand units instead of staying). Each
candidate is applied to the set and the whole set planned again (`fits`); only those that fit are shown,
the first of each kind."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

from planner.core.errors import InfeasiblePlacement, Suggestion
from planner.hardware.budgets import Budgets
from planner.hardware.inventory import Inventory
from planner.search.search import plan
from planner.search.set_input import ModelSet, Residency, SetEntry, plan_request


class Kind(str, Enum):
    """What a suggestion changes, as the error document's `kind` names it."""

    CTX = "ctx"                    # the model's context per slot (`n_ctx`)
    CACHE_TYPE = "cache_type"      # its KV cache type (`cache_type`)
    SLOTS = "slots"                # its slots (`slots`)
    ON_DEMAND = "on-demand"        # a resident model (or its group) loaded on demand instead


@dataclass(frozen=True)
class SetSuggestion(Suggestion):
    """A change to one model's demands that, re-planned as a whole set, fits."""

    model: str = ""
    kind: Kind = Kind.CTX
    slots: int | None = None

    def to_dict(self) -> dict[str, object]:
        out = super().to_dict()
        out.update({"model": self.model, "kind": self.kind.value})
        if self.slots is not None:
            out["slots"] = self.slots
        return out


class SetInfeasible(InfeasiblePlacement):
    """A model of the set does not fit beside the models it must share the devices with."""

    def __init__(self, message: str, model: str, inventory: Inventory, budgets: Budgets,
                 suggestions: tuple[Suggestion, ...] = ()) -> None:
        self.model = model
        # what the models placed before it left the model that did not fit, as its process sees it
        self.inventory = inventory
        self.budgets = budgets
        super().__init__(message, suggestions=suggestions)


def _largest_ctx(e: SetEntry, inventory: Inventory, budgets: Budgets) -> int | None:
    """The largest context per slot that plans within `budgets` (what the model had when it did not fit),
    below the one asked for."""
    try:
        found = plan(e.model, inventory, replace(plan_request(e), max_ctx=True), budgets=budgets, warn=False)
    except InfeasiblePlacement:
        return None
    per_slot = found.n_ctx // e.slots
    return per_slot if e.n_ctx is None or per_slot < e.n_ctx else None


def _candidates(spec: ModelSet, failed: SetInfeasible) -> list[SetSuggestion]:
    name = failed.model
    e = spec.entry(name)
    out: list[SetSuggestion] = []
    n_ctx = _largest_ctx(e, failed.inventory, failed.budgets)
    if n_ctx is not None:
        out.append(SetSuggestion(f"{name}: ctx {n_ctx} fits", n_ctx=n_ctx, model=name, kind=Kind.CTX))
    if e.cache_type != "q8_0":
        out.append(SetSuggestion(f"{name}: cache_type q8_0 fits", cache_type="q8_0", model=name, kind=Kind.CACHE_TYPE))
    out += [SetSuggestion(f"{name}: slots {n} fits", model=name, kind=Kind.SLOTS, slots=n)
            for n in range(e.slots - 1, 0, -1)]
    # moving a resident model out: the lowest priority first, the one that failed among them
    resident = [x for x in spec.entries if x.resident is not Residency.ON_DEMAND]
    for x in sorted(resident, key=lambda x: x.priority):
        out.append(SetSuggestion(f"{x.name}: resident: on-demand fits", model=x.name, kind=Kind.ON_DEMAND))
    return out


def apply_suggestion(spec: ModelSet, s: SetSuggestion) -> ModelSet:
    """The set as the suggestion changes it (a group moves to on-demand as a whole)."""
    if s.kind is Kind.CTX:
        return spec.with_entry(s.model, n_ctx=s.n_ctx)
    if s.kind is Kind.CACHE_TYPE:
        return spec.with_entry(s.model, cache_type=s.cache_type)
    if s.kind is Kind.SLOTS:
        return spec.with_entry(s.model, slots=s.slots)
    group = spec.entry(s.model).group
    members = [x.name for x in spec.entries if x.name == s.model or (group is not None and x.group == group)]
    for m in members:
        spec = spec.with_entry(m, resident=Residency.ON_DEMAND)
    return spec


def suggestions(spec: ModelSet, failed: SetInfeasible, fits: Callable[[ModelSet], bool]) -> list[SetSuggestion]:
    """Each kind's first candidate for which `fits` (the whole set planned again with it) holds; slots
    and on-demand moves stop at the first that fits."""
    found: list[SetSuggestion] = []
    kinds_done: set[Kind] = set()
    for s in _candidates(spec, failed):
        if s.kind in kinds_done:
            continue
        if fits(apply_suggestion(spec, s)):
            found.append(s)
            kinds_done.add(s.kind)
    return found
