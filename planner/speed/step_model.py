"""The batch-N decode step of a placement, and endpoints computing at once (the speed model of `plan --verdict`,
docs/internals/verdict.md).

llama-server's continuous batching decodes its N slots in one step: the weights are read once, each sequence's
KV cache once, N tokens multiplied; per device the slower of memory and compute bounds the stage:

    t_step(N) = sum_d max(W_d / BW_d + N·KV_d / BWatt_d,  N·F_d / FLOPS_d)  +  sum_boundaries (A / L_b + lat_b)

with W_d, KV_d, F_d, the boundaries and the rates as planner/speed/throughput.py has them for one token.
Endpoints run at once, sharing only the cores of CPU rpc-servers whose CPUs overlap (each pool's cores divided
over the threads that want them), and an equal load ends with its slowest client (equal_load_tokens_s).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from planner.hardware.inventory import Backend, Inventory
from planner.llama.commands import LLAMA_SERVER, command_line
from planner.llama.context import ModelContext
from planner.model.costs import CostTable
from planner.speed.throughput import (
    NO_ATTENTION,
    AttentionWork,
    PlacementView,
    Rates,
    decode_attention,
    decode_bytes,
    predict,
    prefill_work,
)

# ---------------------------------------------------------------------------------------------
# the batch-N decode step


@dataclass(frozen=True)
class StepTerms:
    """One decode step of a placement, split into what batching shares and what it multiplies."""

    weight_bytes: dict[str, int]     # per device: read once per step (weights, output matrix)
    kv_bytes: dict[str, int]         # per device: read once per sequence (its KV cache)
    attention: dict[str, AttentionWork]   # per device: the pairs and values of one sequence's attention
    flops: dict[str, float]          # per device: FLOPs of one token
    boundary_s: float                # the hand-offs and boundary copies of one step
    n_boundaries: int
    rate_sources: tuple[str, ...]
    kernel_s: float = 0.0            # the op nodes' kernel time of one step (once a step, however many sequences)


def step_terms(ctx: ModelContext, costs: CostTable, view: PlacementView, inventory: Inventory) -> StepTerms:
    """The terms of t_step(N): the bytes one token reads (throughput.decode_bytes: the weights, and one
    sequence's KV at the view's fill) and the boundaries' cost (throughput.predict's time less its stages)."""
    one = replace(view, n_seq=1)
    weights, kv = decode_bytes(ctx.facts, costs, one)   # the weights do not depend on the cache's fill
    full = predict(ctx.facts, costs, one, inventory)
    stage_s = sum(s.seconds_per_token for s in full.stages)
    boundary_s = max(1.0 / full.decode_tokens_s - stage_s, 0.0) if full.decode_tokens_s else 0.0
    rates = Rates(inventory)
    kernel_s = sum(n * rates.kernel_time(dev) for dev, n in one.kernels)
    work = prefill_work(ctx.facts, costs, replace(one, n_ubatch=1), None)
    flops = dict(work.flops)
    for dev, n in work.attention.items():
        flops[dev] = flops.get(dev, 0.0) + n
    attention = decode_attention(ctx.facts, costs, one)
    return StepTerms(weights, kv, attention, flops, boundary_s, full.n_boundaries, full.rate_sources, kernel_s)


def step_seconds(terms: StepTerms, inventory: Inventory, n_seq: int) -> float:
    """t_step(N) of the module's docstring."""
    rates = Rates(inventory)
    devices = set(terms.weight_bytes) | set(terms.kv_bytes) | set(terms.flops)
    t = terms.boundary_s + terms.kernel_s
    for dev in devices:
        attention = rates.attention_seconds(dev, terms.kv_bytes.get(dev, 0), terms.attention.get(dev, NO_ATTENTION))
        memory = terms.weight_bytes.get(dev, 0) / rates.bandwidth(dev) + n_seq * attention
        compute = n_seq * terms.flops.get(dev, 0.0) / rates.flops(dev)
        t += max(memory, compute)
    return t


# ---------------------------------------------------------------------------------------------
# endpoints at the same time: shared cores, an equal load


def _on_cpus(inventory: Inventory, name: str) -> tuple[tuple[int, ...], int] | None:
    """The CPUs and threads a device computes with, when it is a CPU rpc-server whose CPUs are known."""
    dev = inventory.get(name)
    if dev is None or not dev.cpus or dev.remote_backend not in (None, Backend.CPU):
        return None
    return dev.cpus, dev.threads or len(dev.cpus)


def cpu_shares(inventory: Inventory, busy: list[str]) -> dict[str, float]:
    """Each of `busy` (devices computing at once), as a fraction of its speed alone: devices whose CPUs
    overlap pool them (transitively), and a pool's cores are divided over the threads that want them."""
    known = {n: found for n in busy if (found := _on_cpus(inventory, n)) is not None}
    pools: list[tuple[set[int], list[str]]] = []
    for name, (cpus, _) in known.items():
        joined = [p for p in pools if p[0] & set(cpus)]
        merged = (set(cpus).union(*(p[0] for p in joined)), [name, *(n for p in joined for n in p[1])])
        pools = [p for p in pools if p not in joined] + [merged]
    shares = dict.fromkeys(busy, 1.0)
    for cores, names in pools:
        wanting = sum(known[n][1] for n in names)
        for n in names:
            cpus, threads = known[n]
            shares[n] = threads * min(1.0, len(cores) / wanting) / min(threads, len(cpus))
    return shares


def sharing(endpoints: tuple[Endpoint, ...], inventory: Inventory) -> tuple[Endpoint, ...]:
    """`endpoints`, all computing at once, each with its cpu_share (its devices' least)."""
    shares = cpu_shares(inventory, [n for e in endpoints for n in e.devices])
    return tuple(replace(e, cpu_share=min(shares[n] for n in e.devices)) for e in endpoints)


def equal_load_tokens_s(endpoints: tuple[Endpoint, ...], inventory: Inventory) -> float:
    """The aggregate tokens/s of an equal load per client (docs/internals/verdict.md): every client of an
    endpoint moves at its client_tokens_s under the shares of the endpoints still computing, so they
    finish together; walk from finish to finish until the last."""
    left = {i: 1.0 for i, e in enumerate(endpoints) if e.n_slots}   # each client's work still to do
    elapsed = 0.0
    while left:
        running = sharing(tuple(endpoints[i] for i in left), inventory)
        rate = {i: e.client_tokens_s for i, e in zip(left, running, strict=True)}
        step = min(left[i] / rate[i] for i in left)
        elapsed += step
        left = {i: w - step * rate[i] for i, w in left.items() if w - step * rate[i] > 1e-9}
    return sum(e.n_slots for e in endpoints) / elapsed if elapsed else 0.0


@dataclass(frozen=True)
class Endpoint:
    """One llama-server process of an arrangement."""

    devices: tuple[str, ...]       # the inventory's device names it uses (its layers' devices)
    port: int
    n_slots: int                   # -np: the clients it serves at once
    argv: tuple[str, ...]          # llama-server's arguments, --port included
    stream_tokens_s: float         # one stream alone on it
    batch_tokens_s: float          # its n_slots streams together, alone on its devices
    n_boundaries: int
    cpu_share: float = 1.0         # of its speed alone, while every endpoint of its arrangement computes

    @property
    def client_tokens_s(self) -> float:
        """One of its clients while every endpoint of the arrangement computes."""
        return self.cpu_share * self.batch_tokens_s / self.n_slots

    @property
    def command(self) -> str:
        return command_line(LLAMA_SERVER, self.argv)
