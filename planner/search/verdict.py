"""`plan --verdict`: seed 003 §7's question — one endpoint per device, one split, or the fastest device
with host offload — answered for N concurrent clients and for one stream (docs/internals/verdict.md).

The arrangements, each planned by `search.plan` (so each one's memory is the estimate's):
  (a) one endpoint per device: a model copy planned on each device alone, the N clients spread round-robin;
  (b) one split over all devices: the normal plan with -np N (layers spread evenly where it leaves a device empty);
  (c) the fastest device with host offload: the plan on that device and the host alone, -np N.

llama-server's continuous batching decodes its N slots in one step: the weights are read once, each sequence's
KV cache once, N tokens multiplied; per device the slower of memory and compute bounds the stage:

    t_step(N) = sum_d max(W_d / BW_d + N·KV_d / BWatt_d,  N·F_d / FLOPS_d)  +  sum_boundaries (A / L_b + lat_b)

with W_d, KV_d, F_d, the boundaries and the rates as planner/speed/throughput.py has them for one token. A
split's stages take turns; endpoints run at once, sharing only the cores of CPU rpc-servers whose CPUs overlap
(each pool's cores divided over the threads that want them), and an equal load ends with its slowest client
(equal_load_tokens_s). Ranked by aggregate tokens/s for N clients and by one stream's; within TIE_FRACTION a tie.
"""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from planner.core.errors import BadInput, InfeasiblePlacement
from planner.core.render import table
from planner.hardware.budgets import Budgets
from planner.hardware.inventory import Calibration, DeviceKind, Inventory
from planner.llama.commands import PLANNED_PROGRAM
from planner.llama.context import ModelContext, ModelLike, model_context
from planner.llama.flags import LLAMA_MAX_SEQ, LlamaFlags, arg
from planner.llama.placement import CPU
from planner.memory.estimate import estimate
from planner.search.contexts import above_train_warning
from planner.search.problem import costs_for, row_totals
from planner.search.result import PlanRequest, PlanResult, plan_argv
from planner.search.search import plan
from planner.speed.step_model import Endpoint, equal_load_tokens_s, sharing, step_seconds, step_terms
from planner.speed.throughput import (
    Rates,
    experts_on_host_of,
    predict_estimate,
    view_of_estimate,
)

# llama-server's default --port (tools/server/server.cpp); endpoint i of (a) listens on BASE_PORT + i
BASE_PORT = 8080
# Two arrangements predicted within this fraction of each other are a tie ("≈"): what tells them apart
# (a boundary or two, a slot more) is below what the throughput model resolves (bench_throughput's median
# errors on this machine: bench/README.md).
TIE_FRACTION = 0.05
# llama.cpp numbers the RPC devices of one process from 0, in --rpc order (ggml-rpc.cpp): a device
# that is RPC1 in a two-server inventory is RPC0 of an endpoint that connects to it alone
RPC_PREFIX = "RPC"

log = logging.getLogger(__name__)


class Arrangement(str, Enum):
    ENDPOINTS = "endpoints"   # (a)
    SPLIT = "split"           # (b)
    OFFLOAD = "offload"       # (c)


TITLES: dict[Arrangement, str] = {
    Arrangement.ENDPOINTS: "(a) one endpoint per device",
    Arrangement.SPLIT: "(b) one split over all devices",
    Arrangement.OFFLOAD: "(c) fastest device + host offload",
}


# ---------------------------------------------------------------------------------------------
# the result


@dataclass(frozen=True)
class Option:
    """One arrangement as predicted, or why it cannot run (`impossible`)."""

    arrangement: Arrangement
    endpoints: tuple[Endpoint, ...] = ()
    clients_tokens_s: float = 0.0       # aggregate over the N clients
    slowest_client_tokens_s: float = 0.0
    stream_tokens_s: float = 0.0        # one stream alone (on the fastest endpoint for (a))
    note: str = ""
    impossible: str = ""

    @property
    def possible(self) -> bool:
        return not self.impossible

    def to_dict(self) -> dict[str, Any]:
        return {"arrangement": self.arrangement.value, "title": TITLES[self.arrangement],
                "possible": self.possible, "impossible": self.impossible or None, "note": self.note or None,
                "clients_tokens_s": round(self.clients_tokens_s, 2),
                "slowest_client_tokens_s": round(self.slowest_client_tokens_s, 2),
                "stream_tokens_s": round(self.stream_tokens_s, 2),
                "endpoints": [{"devices": list(e.devices), "port": e.port, "n_slots": e.n_slots,
                               "argv": list(e.argv), "command": e.command,
                               "stream_tokens_s": round(e.stream_tokens_s, 2),
                               "batch_tokens_s": round(e.batch_tokens_s, 2), "cpu_share": round(e.cpu_share, 3),
                               "boundaries_per_token": e.n_boundaries}
                              for e in self.endpoints]}


@dataclass(frozen=True)
class Verdict:
    model_path: str
    n_clients: int
    n_ctx_per_client: int
    options: tuple[Option, ...]
    not_helping: tuple[str, ...]
    rate_sources: tuple[str, ...]
    explain: tuple[str, ...] = ()

    def option(self, arrangement: Arrangement) -> Option:
        return next(o for o in self.options if o.arrangement is arrangement)

    @property
    def by_clients(self) -> tuple[Arrangement, ...]:
        """The possible arrangements, most aggregate tokens/s for N clients first (ties: a, b, c)."""
        return tuple(o.arrangement for o in sorted((o for o in self.options if o.possible),
                                                   key=lambda o: -round(o.clients_tokens_s, 6)))

    @property
    def by_stream(self) -> tuple[Arrangement, ...]:
        return tuple(o.arrangement for o in sorted((o for o in self.options if o.possible),
                                                   key=lambda o: -round(o.stream_tokens_s, 6)))

    def ranking_text(self, clients: bool) -> str:
        """The ranking with ties: "(a) > (b) ≈ (c)" — each sign compares neighbours (relation())."""
        order = self.by_clients if clients else self.by_stream
        value = {o.arrangement: o.clients_tokens_s if clients else o.stream_tokens_s for o in self.options}
        text = _short(order[0]) if order else ""
        for prev, cur in itertools.pairwise(order):
            text += f" {relation(value[prev], value[cur])} {_short(cur)}"
        return text

    @property
    def winner(self) -> Option | None:
        ranked = self.by_clients if self.n_clients > 1 else self.by_stream
        return self.option(ranked[0]) if ranked else None

    def commands(self) -> list[str]:
        """The winning arrangement's llama-server lines, one per endpoint."""
        return [e.command for e in self.winner.endpoints] if self.winner else []

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model_path, "clients": self.n_clients, "ctx_per_client": self.n_ctx_per_client,
                "ranking_clients": [a.value for a in self.by_clients],
                "ranking_stream": [a.value for a in self.by_stream],
                "ranking_clients_text": self.ranking_text(clients=True),
                "ranking_stream_text": self.ranking_text(clients=False),
                "winner": self.winner.arrangement.value if self.winner else None,
                "commands": self.commands(), "options": [o.to_dict() for o in self.options],
                "not_helping": list(self.not_helping), "rate_sources": list(self.rate_sources),
                "explain": list(self.explain)}

    def to_table(self) -> str:
        rows = []
        for o in self.options:
            if o.possible:
                rows.append([TITLES[o.arrangement], f"{o.clients_tokens_s:.1f}", f"{o.slowest_client_tokens_s:.1f}",
                             f"{o.stream_tokens_s:.1f}", _layout(o)])
            else:
                rows.append([TITLES[o.arrangement], "-", "-", "-", "impossible: " + o.impossible])
        winner = self.winner
        lines = [f"{self.model_path}: {self.n_clients} client(s), context {self.n_ctx_per_client} each"
                 + (" (calibrated rates)" if "calibrated" in self.rate_sources else "")
                 + (" (some device rates unknown: assumed figures used)" if "assumed" in self.rate_sources else ""),
                 "",
                 table(["arrangement", f"{self.n_clients} clients tokens/s", "per client", "1 stream tokens/s",
                        "endpoints"], rows, align="lrrrl"),
                 "",
                 *([f"ranking for {self.n_clients} clients: " + self.ranking_text(clients=True)]
                   if self.n_clients > 1 else []),
                 "ranking for one stream: " + self.ranking_text(clients=False)]
        if winner is not None:
            lines += ["", f"run {TITLES[winner.arrangement]} (each command is one shell line, quoted for bash):"]
            lines += [f"  {c}" for c in self.commands()]
        if self.not_helping:
            lines += ["", "what would not help:"] + [f"  {n}" for n in self.not_helping]
        if self.explain:
            lines += ["", "why:"] + [f"  {line}" for line in self.explain]
        return "\n".join(lines) + "\n"


def relation(x: float, y: float) -> str:
    """">" or "<", or "≈" where x and y are within TIE_FRACTION of the larger."""
    if abs(x - y) <= TIE_FRACTION * max(x, y):
        return "≈"
    return ">" if x > y else "<"


def _short(a: Arrangement) -> str:
    return TITLES[a].split(" ", 1)[0]


def _layout(o: Option) -> str:
    return "; ".join(f"{'+'.join(e.devices) or CPU} -np {e.n_slots} :{e.port}" for e in o.endpoints)


# ---------------------------------------------------------------------------------------------
# planning each arrangement


@dataclass(frozen=True)
class _Planned:
    """A plan of one endpoint and the names its devices have in the user's inventory."""

    result: PlanResult
    names: dict[str, str]    # the endpoint's device name -> the inventory's


def _renamed(cal: Calibration | None, name: str, local: str) -> Calibration | None:
    """The calibration of one device (and the host) under the name the endpoint gives it."""
    if cal is None:
        return None
    figures = tuple(replace(f, device=local) if f.device == name else f for f in cal.figures
                    if f.device in (name, CPU))
    return replace(cal, figures=figures)


def _alone(inventory: Inventory, budgets: Budgets, name: str, host_share: int) -> tuple[Inventory, Budgets, str]:
    """A one-device inventory of `name` (an RPC device renamed RPC0, as its endpoint numbers it) with
    its budget and `host_share` of the host's."""
    dev = inventory.get(name)
    if dev is None:
        raise BadInput(f"--verdict: no device {name} in the inventory")
    local = f"{RPC_PREFIX}0" if dev.kind is DeviceKind.RPC else name
    inv = Inventory((replace(dev, name=local),), inventory.host, inventory.source,
                    _renamed(inventory.calibration, name, local))
    pool = budgets.uma_pool_bytes
    sub = Budgets({local: budgets.devices.get(name, dev.free_bytes)}, host_share,
                  None if pool is None else pool * host_share // max(budgets.host_bytes, 1),
                  (local,) if name in budgets.pool_devices else ())
    return inv, sub, local


def _all_on_devices(result: PlanResult) -> bool:
    est = result.estimate
    on = {il for dev, layers in est.layers if dev != CPU for il in layers}
    return on >= set(range(est.n_layer_all + 1)) and not result.experts_on_host and not est.output_on_host


def _spread(ctx: ModelContext, result: PlanResult, names: list[str]) -> PlanResult | None:
    """The plan's settings with every layer on the devices `names`, spread evenly (-ts in layers, as
    the planner writes it); None when that is over a budget."""
    n = ctx.facts.n_layer_all + 1
    counts = tuple(float(n // len(names) + (i < n % len(names))) for i in range(len(names)))
    flags = replace(result.flags, n_gpu_layers=n, tensor_split=counts if len(names) > 1 else (), override_args=())
    est = estimate(ctx, flags, result.inventory, program=PLANNED_PROGRAM)
    if result.budgets.over(row_totals(est)):
        return None
    costs = costs_for(ctx, flags.cache_type_k)
    pred = predict_estimate(ctx, costs, est, result.inventory, experts_on_host_of(est), est.output_on_host)
    return replace(result, flags=flags, estimate=est, prediction=pred, experts_on_host=frozenset())


def _plan(ctx: ModelContext, inventory: Inventory, budgets: Budgets, req: PlanRequest, per_client: int,
          n_slots: int) -> PlanResult | str:
    """The plan with `n_slots` slots of `per_client` context each, or why none fits."""
    if n_slots > LLAMA_MAX_SEQ:
        return f"{n_slots} slots: one llama.cpp server holds at most {LLAMA_MAX_SEQ} sequences (LLAMA_MAX_SEQ)"
    r = replace(req, n_ctx=per_client * n_slots, max_ctx=False, n_parallel=n_slots)
    try:
        return plan(ctx, inventory, r, budgets=budgets, warn=False)
    except InfeasiblePlacement as e:
        return str(e)


def _endpoint(ctx: ModelContext, p: _Planned, port: int, n_past: int | None) -> Endpoint:
    result = p.result
    view = view_of_estimate(ctx, result.estimate, result.experts_on_host, result.estimate.output_on_host, n_past)
    terms = step_terms(ctx, costs_for(ctx, result.flags.cache_type_k), view, result.inventory)
    k = result.flags.n_parallel
    used = tuple(p.names.get(dev, dev) for dev, layers in result.estimate.layers if dev != CPU and layers)
    return Endpoint(used, port, k, tuple(plan_argv(result) + arg("port", port)),
                    1.0 / step_seconds(terms, result.inventory, 1), k / step_seconds(terms, result.inventory, k),
                    terms.n_boundaries)


def _slots(n_clients: int, n_endpoints: int) -> list[int]:
    """Clients per endpoint as a round-robin balancer spreads them (the first endpoints get one more)."""
    return [n_clients // n_endpoints + (i < n_clients % n_endpoints) for i in range(n_endpoints)]


@dataclass(frozen=True)
class _Context:
    ctx: ModelContext
    inventory: Inventory
    budgets: Budgets
    request: PlanRequest
    n_clients: int
    per_client: int
    n_past: int | None


def _copy_on(c: _Context, name: str, n_slots: int, n_endpoints: int) -> _Planned | str:
    """A whole model copy on device `name` alone with `n_slots` slots, or why there is none."""
    inv, budgets, local = _alone(c.inventory, c.budgets, name, c.budgets.host_bytes // n_endpoints)
    req = replace(c.request, allow_expert_offload=False, allow_output_on_host=False)
    found = _plan(c.ctx, inv, budgets, req, c.per_client, n_slots)
    if isinstance(found, str):
        return found
    if not _all_on_devices(found):
        spread = _spread(c.ctx, found, [local])
        if spread is None:
            kept = found.estimate.n_layer_all + 1 - sum(len(ls) for d, ls in found.estimate.layers if d != CPU)
            return f"{name} alone holds the model only with {kept} layer(s) kept in host memory"
        found = spread
    return _Planned(found, {local: name})


def _endpoints(c: _Context, not_helping: list[str]) -> Option:
    """(a): a copy per device that holds one; the fastest copies serve the most clients."""
    names = c.inventory.names
    probe = {n: _copy_on(c, n, 1, len(names)) for n in names}
    held = [n for n in names if not isinstance(probe[n], str)]
    if not held:
        why = "; ".join(f"{n}: {probe[n]}" for n in names)
        return Option(Arrangement.ENDPOINTS, impossible=f"the model fits no single device ({why})")
    single = {n: _endpoint(c.ctx, p, 0, c.n_past) for n in held if isinstance(p := probe[n], _Planned)}
    order = sorted(held, key=lambda n: -single[n].stream_tokens_s)
    endpoints: list[Endpoint] = []
    for i, (name, k) in enumerate(zip(order, _slots(c.n_clients, len(order)), strict=True)):
        if k == 0:
            continue
        planned = probe[name] if k == 1 else _copy_on(c, name, k, len(names))
        if isinstance(planned, str):
            not_helping.append(f"{k} slots of context {c.per_client} on {name}: more slots than its KV cache fits "
                               f"({planned})")
            return Option(Arrangement.ENDPOINTS, impossible=f"{name} holds the model but not {k} slots of context "
                          f"{c.per_client}")
        endpoints.append(_endpoint(c.ctx, planned, BASE_PORT + i, c.n_past))
    left = [n for n in names if n not in held]
    note = f"no copy fits {', '.join(left)}" if left else ""
    ready = sharing(tuple(endpoints), c.inventory)
    if any(e.cpu_share < 1 for e in ready):
        note = "; ".join(filter(None, [note, "endpoints share host cores: " + ", ".join(
            f"{'+'.join(e.devices)} at {e.cpu_share:.2f}" for e in ready if e.cpu_share < 1)]))
    return Option(Arrangement.ENDPOINTS, ready, equal_load_tokens_s(ready, c.inventory),
                  min(e.client_tokens_s for e in ready), single[order[0]].stream_tokens_s, note)


def _one_process(c: _Context, arrangement: Arrangement, found: PlanResult | str, names: dict[str, str],
                 not_helping: list[str], one_slot: PlanResult | str) -> Option:
    if isinstance(found, str):
        if not isinstance(one_slot, str):
            not_helping.append(f"{TITLES[arrangement]} with {c.n_clients} slots of context {c.per_client}: "
                               f"more slots than the KV cache fits ({found})")
        return Option(arrangement, impossible=found)
    e = _endpoint(c.ctx, _Planned(found, names), BASE_PORT, c.n_past)
    single = e if c.n_clients == 1 or isinstance(one_slot, str) else \
        _endpoint(c.ctx, _Planned(one_slot, names), BASE_PORT, c.n_past)
    return Option(arrangement, (e,), e.batch_tokens_s, e.batch_tokens_s / e.n_slots, single.stream_tokens_s)


def _split(c: _Context, not_helping: list[str]) -> Option:
    """(b): the normal plan with -np N; spread evenly over every device where it leaves one empty."""
    def over_all(n_slots: int) -> PlanResult | str:
        found = _plan(c.ctx, c.inventory, c.budgets, c.request, c.per_client, n_slots)
        if isinstance(found, str):
            return found
        used = {d for d, layers in found.estimate.layers if d != CPU and layers}
        if used >= set(c.inventory.names):
            return found
        return _spread(c.ctx, found, c.inventory.names) or found
    found = over_all(c.n_clients)
    one = found if c.n_clients == 1 else over_all(1)
    return _one_process(c, Arrangement.SPLIT, found, {}, not_helping, one)


def _fastest(inventory: Inventory) -> str:
    rates = Rates(inventory)
    return max(inventory.names, key=lambda n: (rates.bandwidth(n), -inventory.names.index(n)))


def _offload(c: _Context, not_helping: list[str]) -> Option:
    """(c): the fastest device and the host, the normal plan with -np N."""
    name = _fastest(c.inventory)
    inv, budgets, local = _alone(c.inventory, c.budgets, name, c.budgets.host_bytes)
    found = _plan(c.ctx, inv, budgets, c.request, c.per_client, c.n_clients)
    one = found if c.n_clients == 1 else _plan(c.ctx, inv, budgets, c.request, c.per_client, 1)
    option = _one_process(c, Arrangement.OFFLOAD, found, {local: name}, not_helping, one)
    if option.possible and not isinstance(found, str) and _all_on_devices(found):
        option = replace(option, note=f"the model fits {name}: nothing is offloaded")
    return option


def verdict(model: ModelLike, inventory: Inventory, budgets: Budgets, request: PlanRequest | None = None,
            n_clients: int = 1, n_past: int | None = None) -> Verdict:
    """The three arrangements for `n_clients` concurrent streams and for one, ranked. `request.n_ctx`
    is each client's context (default: the training context); `n_past`: the cells each sequence's
    cache holds when it decodes (None: a full context, as the plan's own prediction assumes)."""
    request = request or PlanRequest()
    if n_clients < 1:
        raise BadInput(f"--clients {n_clients}: expected a positive number of concurrent streams")
    if len(inventory.devices) < 2:
        raise BadInput("--verdict compares arrangements over several devices; the inventory has "
                       f"{len(inventory.devices)}")
    if request.max_ctx:
        raise BadInput("--verdict plans each client's context as given: --ctx N (or the training context), not max")
    ctx = model_context(model)
    per_client = request.n_ctx or ctx.facts.n_ctx_train
    if not per_client:
        raise BadInput(f"{ctx.model.path}: the model declares no training context; give --ctx")
    c = _Context(ctx, inventory, budgets, replace(request, n_ctx=per_client), n_clients, per_client, n_past)
    # each arrangement is planned quietly; every slot holds per_client cells, so the warning is one
    warning = above_train_warning(ctx, LlamaFlags(n_ctx=per_client))
    if warning:
        log.warning("%s", warning)
    not_helping: list[str] = []
    options = (_endpoints(c, not_helping), _split(c, not_helping), _offload(c, not_helping))
    if not any(o.possible for o in options):
        raise InfeasiblePlacement(f"no arrangement of {ctx.model.path} for {n_clients} client(s) of context "
                                  f"{per_client} fits: " + "; ".join(f"{_short(o.arrangement)} {o.impossible}"
                                                                     for o in options))
    sources = sorted({s for o in options for e in o.endpoints for s in _sources(ctx, e, c)},
                     key=("calibrated", "stated", "assumed").index)
    v = Verdict(ctx.model.path, n_clients, per_client, options, (), tuple(sources))
    return replace(v, not_helping=tuple(not_helping + _what_does_not_help(v, inventory)),
                   explain=tuple(_explain(v)))


def _sources(ctx: ModelContext, e: Endpoint, c: _Context) -> tuple[str, ...]:
    rates = Rates(c.inventory)
    for name in e.devices:
        rates.bandwidth(name)
        rates.flops(name)
    rates.bandwidth(CPU)
    return rates.source_list


def _what_does_not_help(v: Verdict, inventory: Inventory) -> list[str]:
    """Seed 003 §7 (4), for this inventory and model."""
    a, b, cc = (v.option(x) for x in Arrangement)
    out = []
    if a.possible and b.possible and b.stream_tokens_s < a.stream_tokens_s:
        extra = b.endpoints[0].n_boundaries - max(e.n_boundaries for e in a.endpoints)
        link = " over the network (rpc-servers)" if any(d.endpoint for d in inventory.devices) else ""
        out.append(f"a split{link} for a model that fits one device: {extra} more boundary(ies) per token "
                   f"(one stream {b.stream_tokens_s:.1f} vs {a.stream_tokens_s:.1f} tokens/s), and its devices take "
                   "turns on every token instead of serving clients at once")
    if cc.possible and not cc.note and a.possible and cc.stream_tokens_s < a.stream_tokens_s:
        out.append(f"host offload beside the fastest device: the host's layers are read at host bandwidth "
                   f"(one stream {cc.stream_tokens_s:.1f} vs {a.stream_tokens_s:.1f} tokens/s)")
    rates = Rates(inventory)
    bws = [rates.bandwidth(n) for n in inventory.names]
    if max(bws) > 1.25 * min(bws):
        out.append("-sm tensor across unequal devices: every step waits for the slowest member "
                   f"({min(bws) / 1e9:.0f} vs {max(bws) / 1e9:.0f} GB/s)")
    out.append("the KV cache away from its attention (-nkvo, or the cache on another device): attention reads "
               "the whole cache every token, over the link")
    return out


def _explain(v: Verdict) -> list[str]:
    """The arithmetic behind each figure."""
    lines = ["a decode step of N slots reads the weights once and each sequence's KV cache, and multiplies N "
             "tokens; per device the slower of memory and compute bounds it; a split's devices take turns, "
             "separate endpoints run at once"]
    for o in v.options:
        if not o.possible:
            lines.append(f"{TITLES[o.arrangement]}: impossible: {o.impossible}")
            continue
        parts = [f"{'+'.join(e.devices) or CPU} -np {e.n_slots}: {e.batch_tokens_s:.1f} tokens/s together "
                 f"({1e3 * e.n_slots / e.batch_tokens_s:.2f} ms/step, {e.n_boundaries} boundary(ies))"
                 for e in o.endpoints]
        lines.append(f"{TITLES[o.arrangement]}: " + "; ".join(parts) + f"; one stream {o.stream_tokens_s:.1f} "
                     "tokens/s" + (f" ({o.note})" if o.note else ""))
    return lines

