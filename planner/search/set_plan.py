"""Several models on one box (`fitplan plan-set`): which stay resident together, which load on demand,
and where each one's layers go within what the others leave (issue #44).

Each model is planned by `planning.search.plan` alone, against the budgets less every row the models
placed before it hold (each llama-server process allocates its own buffers, so the rows add up):

1. the units (a group, or a model on its own) that are `always` resident, highest priority first; one
   that does not fit is tried again placed first (the devices' first choice may be what it needs);
2. the `auto` units in the same order, each resident when it plans beside those, else on demand;
3. each on-demand unit against what the resident set leaves: the on-demand units swap with one
   another, so one of them at a time is loaded beside the resident set, and its load evicts the
   others. Its load cost is the bytes of its tensors and, given the disk's read rate, the seconds.

A set whose always-resident units, or one of whose on-demand units, do not fit is infeasible, with
suggestions each re-planned as a whole set before they are shown (planning/set_suggest.py).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from planner.core.errors import InfeasiblePlacement
from planner.hardware.budgets import Budgets
from planner.hardware.inventory import Inventory, number_devices
from planner.llama.context import model_context
from planner.llama.placement import HOST
from planner.search.problem import row_totals
from planner.search.result import PlanResult
from planner.search.search import plan
from planner.search.set_input import ModelSet, Residency, SetEntry, plan_request
from planner.search.set_suggest import SetInfeasible, suggestions

log = logging.getLogger(__name__)

RESIDENT = "resident"   # the name of the set every state starts from


@dataclass(frozen=True)
class Unit:
    """Models that are resident together: a group, or one model on its own."""

    name: str
    members: tuple[SetEntry, ...]

    @property
    def resident(self) -> Residency:
        return self.members[0].resident   # set_input checks one residency per group

    @property
    def priority(self) -> int:
        return max(e.priority for e in self.members)


@dataclass(frozen=True)
class ModelPlan:
    entry: SetEntry
    result: PlanResult
    resident: bool                 # loaded with the resident set (else on demand)
    demoted: bool = False          # `auto`, and on demand because it did not fit beside the resident set
    # its process's RPC device names -> the box's (llama.cpp numbers the RPC devices of each process
    # RPC0.. in its --rpc order, and a process is given only the rpc-servers no other loaded model holds)
    names: tuple[tuple[str, str], ...] = ()

    def box_name(self, row: str) -> str:
        return dict(self.names).get(row, row)

    @property
    def rows(self) -> dict[str, int]:
        """Bytes per budget row, under the box's device names."""
        return {self.box_name(k): v for k, v in row_totals(self.result.estimate).items()}

    @property
    def endpoints(self) -> frozenset[str]:
        """The rpc-servers its process connects to (every one its --rpc names)."""
        return frozenset(d.endpoint for d in self.result.inventory.devices if d.endpoint)


@dataclass(frozen=True)
class OnDemand:
    """One on-demand unit: what its load reads and which units it evicts."""

    unit: str
    members: tuple[str, ...]
    load_bytes: int
    load_seconds: float | None     # None without the set's disk_read
    evicts: tuple[str, ...]


@dataclass(frozen=True)
class SetState:
    """Models loaded at one time: the resident set, or it and one on-demand unit."""

    name: str
    models: tuple[str, ...]
    rows: tuple[tuple[str, tuple[tuple[str, int], ...]], ...]   # row -> (model, bytes) per model


@dataclass(frozen=True)
class SetPlan:
    spec: ModelSet
    inventory: Inventory
    budgets: Budgets
    models: tuple[ModelPlan, ...]
    on_demand: tuple[OnDemand, ...]
    states: tuple[SetState, ...]

    def model(self, name: str) -> ModelPlan:
        return next(m for m in self.models if m.entry.name == name)


# --- units and budgets --------------------------------------------------------------------------

def units_of(spec: ModelSet) -> list[Unit]:
    """The set's units in the order they are placed: highest priority first, then file order."""
    groups: dict[str, list[SetEntry]] = {}
    for e in spec.entries:
        groups.setdefault(e.group or f"\0{e.name}", []).append(e)
    units = [Unit(k.lstrip("\0"), tuple(sorted(v, key=lambda e: -e.priority))) for k, v in groups.items()]
    return sorted(units, key=lambda u: -u.priority)


def left_over(budgets: Budgets, used: Mapping[str, int]) -> Budgets:
    """The budgets less what other processes hold (`used`: bytes per budget row, HOST for the host's)."""
    pool = budgets.uma_pool_bytes
    if pool is not None:
        pool = max(0, pool - budgets.pooled(used))
    return Budgets({n: max(0, b - used.get(n, 0)) for n, b in budgets.devices.items()},
                   max(0, budgets.host_bytes - used.get(HOST, 0)), pool, budgets.pool_devices)


def _add(used: Mapping[str, int], rows: Mapping[str, int]) -> dict[str, int]:
    out = dict(used)
    for k, v in rows.items():
        out[k] = out.get(k, 0) + v
    return out


@dataclass(frozen=True)
class Room:
    """What the processes loaded so far hold: bytes per budget row (the box's names), and the rpc-servers
    they are connected to (a ggml-rpc-server serves one client at a time: ggml-rpc.cpp's accept loop)."""

    used: tuple[tuple[str, int], ...] = ()
    taken: frozenset[str] = frozenset()
    loaded: tuple[str, ...] = ()   # the models, by name

    def adding(self, p: ModelPlan) -> Room:
        return Room(tuple(_add(dict(self.used), p.rows).items()), self.taken | p.endpoints,
                    (*self.loaded, p.entry.name))


def process_view(inventory: Inventory, budgets: Budgets, room: Room) -> tuple[Inventory, Budgets, dict[str, str]]:
    """The inventory and budgets one more process sees: the rpc-servers others hold left out, its RPC
    devices numbered RPC0.. in order (number_devices), the budgets less what the others use; and its
    device names -> the box's."""
    left = left_over(budgets, dict(room.used))
    kept = [d for d in inventory.devices if d.endpoint is None or d.endpoint not in room.taken]
    renamed = number_devices(kept)
    names = {new.name: old.name for old, new in zip(kept, renamed, strict=True)}
    view = replace(inventory, devices=tuple(renamed))
    return view, replace(left, devices={n: left.devices.get(old, 0) for n, old in names.items()}), names


def _plan_model(e: SetEntry, inventory: Inventory, budgets: Budgets, room: Room, resident: bool,
                demoted: bool) -> ModelPlan:
    """One model planned as its own process beside `room`; with rpc-servers it leaves unused, planned
    again without them (its --rpc would hold them)."""
    view, left, names = process_view(inventory, budgets, room)
    try:
        result = plan(e.model, view, plan_request(e), budgets=left, warn=False)
    except InfeasiblePlacement as err:
        beside = f" beside {', '.join(room.loaded)}" if room.loaded else ""
        raise SetInfeasible(f"{e.name} does not fit{beside} ({err})", e.name, view, left) from None
    found = ModelPlan(e, result, resident, demoted, tuple(names.items()))
    idle = found.endpoints - _endpoints_with_bytes(found)
    if idle:
        try:
            return _plan_model(e, inventory, budgets, Room(room.used, room.taken | idle, room.loaded), resident,
                               demoted)
        except SetInfeasible:
            return found
    return found


def _endpoints_with_bytes(p: ModelPlan) -> frozenset[str]:
    rows = row_totals(p.result.estimate)
    return frozenset(d.endpoint for d in p.result.inventory.devices if d.endpoint and rows.get(d.name, 0) > 0)


def _place(unit: Unit, inventory: Inventory, budgets: Budgets, room: Room, resident: bool,
           demoted: bool = False) -> tuple[list[ModelPlan], Room]:
    """Each member planned within what the models before it leave; SetInfeasible names the member."""
    plans: list[ModelPlan] = []
    for e in unit.members:
        p = _plan_model(e, inventory, budgets, room, resident, demoted)
        plans.append(p)
        room = room.adding(p)
    return plans, room


# --- the set --------------------------------------------------------------------------------------

def _resident(units: list[Unit], inventory: Inventory, budgets: Budgets, held_back: frozenset[str]
              ) -> tuple[list[ModelPlan], Room, list[Unit]]:
    """The always units (each must fit), then the auto ones that fit beside them (but those held back);
    the auto units left on demand."""
    placed, room = _always([u for u in units if u.resident is Residency.ALWAYS], inventory, budgets)
    demoted: list[Unit] = []
    for u in (u for u in units if u.resident is Residency.AUTO):
        if u.name in held_back:
            demoted.append(u)
            continue
        try:
            plans, room = _place(u, inventory, budgets, room, resident=True)
            placed += plans
        except SetInfeasible as err:
            log.info("%s: on demand (%s)", u.name, err)
            demoted.append(u)
    return placed, room, demoted


def _always(units: list[Unit], inventory: Inventory, budgets: Budgets) -> tuple[list[ModelPlan], Room]:
    """The always units in priority order; when one does not fit, again with it placed first (the
    first choice of the devices may be what it needs), each unit at most once; the first order that
    fits, else the priority order's error."""
    order, first_error = list(units), None
    tried: set[str] = set()
    while True:
        placed: list[ModelPlan] = []
        room = Room()
        try:
            for u in order:
                plans, room = _place(u, inventory, budgets, room, resident=True)
                placed += plans
            return placed, room
        except SetInfeasible as err:
            first_error = first_error or err
            failed = next(u for u in order if any(e.name == err.model for e in u.members))
            if failed.name in tried or order[0] is failed:
                raise first_error from None
            tried.add(failed.name)
            order = [failed] + [u for u in order if u is not failed]


def _load_bytes(unit: Unit) -> int:
    return sum(model_context(e.model).model.total_tensor_bytes for e in unit.members)


def plan_set_once(spec: ModelSet, inventory: Inventory, budgets: Budgets) -> SetPlan:
    """The set's plan, or SetInfeasible without suggestions. When an on-demand unit does not fit beside
    the resident set, the auto units made resident go on demand too, the lowest priority first."""
    units = units_of(spec)
    held_back: frozenset[str] = frozenset()
    while True:
        try:
            return _plan_units(spec, units, inventory, budgets, held_back)
        except _OnDemandMisfit as misfit:
            if not misfit.resident_auto:
                raise misfit.error from None
            held_back |= {misfit.resident_auto[-1]}


class _OnDemandMisfit(Exception):
    def __init__(self, error: SetInfeasible, resident_auto: list[str]) -> None:
        self.error = error
        self.resident_auto = resident_auto   # the auto units resident, in the order they were placed


def _plan_units(spec: ModelSet, units: list[Unit], inventory: Inventory, budgets: Budgets,
                held_back: frozenset[str]) -> SetPlan:
    placed, room, demoted = _resident(units, inventory, budgets, held_back)
    swapping = [u for u in units if u.resident is Residency.ON_DEMAND] + demoted
    on_demand: list[OnDemand] = []
    states = [_state(RESIDENT, placed, inventory)]
    resident_auto = [u.name for u in units if u.resident is Residency.AUTO and u not in demoted]
    for u in swapping:
        try:
            plans, _ = _place(u, inventory, budgets, room, resident=False, demoted=u in demoted)
        except SetInfeasible as err:
            raise _OnDemandMisfit(err, resident_auto) from None
        placed += plans
        n_bytes = _load_bytes(u)
        seconds = None if spec.disk_read_bytes_s is None else round(n_bytes / spec.disk_read_bytes_s, 3)
        on_demand.append(OnDemand(u.name, tuple(e.name for e in u.members), n_bytes, seconds,
                                  tuple(o.name for o in swapping if o is not u)))
        states.append(_state(f"{RESIDENT}+{u.name}", [p for p in placed if p.resident] + plans, inventory))
    order = {e.name: i for i, e in enumerate(spec.entries)}
    return SetPlan(spec, inventory, budgets, tuple(sorted(placed, key=lambda p: order[p.entry.name])),
                   tuple(on_demand), tuple(states))


def _state(name: str, plans: list[ModelPlan], inventory: Inventory) -> SetState:
    """The rows of the models loaded at one time, in the inventory's device order and Host last."""
    rows: dict[str, list[tuple[str, int]]] = {n: [] for n in [*inventory.names, HOST]}
    for p in plans:
        for row, n in p.rows.items():
            rows.setdefault(row, []).append((p.entry.name, n))
    return SetState(name, tuple(p.entry.name for p in plans), tuple((r, tuple(v)) for r, v in rows.items() if v))


def plan_set(spec: ModelSet, inventory: Inventory, budgets: Budgets) -> SetPlan:
    """The set's plan; SetInfeasible with what would fit, each suggestion re-planned as a whole set."""
    try:
        return plan_set_once(spec, inventory, budgets)
    except SetInfeasible as err:
        hints = tuple(suggestions(spec, err, lambda changed: _fits(changed, inventory, budgets)))
        raise SetInfeasible(f"{spec.source}: {err}", err.model, err.inventory, err.budgets,
                           hints) from None


def _fits(spec: ModelSet, inventory: Inventory, budgets: Budgets) -> bool:
    try:
        plan_set_once(spec, inventory, budgets)
    except SetInfeasible:
        return False
    return True


def set_rows(state: SetState) -> list[dict[str, Any]]:
    """A state's rows: per row, each model's bytes and their sum."""
    return [{"name": row, "models": dict(per), "total_bytes": sum(n for _, n in per)} for row, per in state.rows]
