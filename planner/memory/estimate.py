"""`fitplan estimate`: what the pinned llama.cpp would allocate on each device for a set of flags.

Rows follow llama.cpp's memory breakdown (common_get_device_memory_data / --fit-print): one per
model device in llama.cpp's order, then `Host` (every host buffer: CPU weights, CPU KV, the CPU
compute buffer), then `CPU_REPACK` when repacked weights exist — --fit-print leaves that buffer
out of its Host line, so it gets its own row. Figures are bytes inside.

For a planner calling this many times: build a `ModelContext` once (`model_context`), then each
`estimate(ctx, flags)` is O(layers + tensors x override rules) and reads no file.
"""
from __future__ import annotations

import shlex
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from planner.core.errors import FlagError
from planner.core.render import layer_ranges, table
from planner.core.units import fmt_mib
from planner.hardware.inventory import Inventory
from planner.llama.context import ModelContext, ModelLike, model_context
from planner.llama.flags import LlamaFlags, flags_to_argv, parse_llama_flags
from planner.llama.kv import context_bytes, layer_caches
from planner.llama.overhead import Overhead, device_overhead, overheads
from planner.llama.placement import CPU, CPU_REPACK, HOST, INPUT_LAYER, device_of
from planner.llama.programs import PROGRAM_NAMES, Program, dry_run, effective_program, outputs_max, program_argv
from planner.llama.settings import ContextParams, LlamaSettings, resolve_settings
from planner.llama.tensor_parallel import META_NAME
from planner.memory.analytic import FORMULA, SIMULATED, compute_model, formula_safety
from planner.memory.companion_memory import estimate_companions
from planner.memory.rows import CompanionEstimate, DeviceMemory, summed, weight_rows
from planner.memory.tensor_members import member_rows
from planner.model.arch import AttnKind
from planner.model.tensors import OUTPUT
from runtime.engine.meta_check import llama_abort, meta_split_error
from runtime.engine.reserve import decode_kernels, decode_splits, supported
from runtime.ggml.profiles import Backend


@dataclass(frozen=True)
class Estimate:
    model_path: str
    flags: LlamaFlags
    cparams: ContextParams
    devices: tuple[DeviceMemory, ...]
    layers: tuple[tuple[str, tuple[int, ...]], ...]   # (device, layer indices; n_layer_all = output)
    output_device: str
    moved: tuple[tuple[str, str], ...]
    pipeline_parallel: bool
    n_layer_all: int
    compute_model: str = SIMULATED   # "simulated" (the scheduler's reserve) or "formula" (planner/memory/analytic.py)
    model_arch: str = ""
    companions: tuple[CompanionEstimate, ...] = ()   # drafter, projector, adapters (planner/memory/companion_memory.py)
    # -sm tensor: each real device behind the Meta() row as a real load allocates it
    # (planner/memory/tensor_members.py); not rows of llama.cpp's breakdown
    meta_members: tuple[DeviceMemory, ...] = ()
    # per device name (`CPU` for the host), the one-token graph's nodes that run an op, as the simulated
    # reserve's scheduler placed them (runtime/engine/reserve.py decode_kernels); empty for a formula estimate
    decode_kernels: tuple[tuple[str, int], ...] = ()
    program: Program = Program.FIT_PARAMS   # whose allocation the rows are (planner/llama/programs.py)
    notes: tuple[str, ...] = ()   # what the rows leave out (an architecture whose caches are not sized)
    # per row, the formula's stated safety term, included in compute_bytes (planner/memory/analytic.py
    # formula_safety); empty where the compute is simulated
    compute_safety: tuple[tuple[str, int], ...] = ()
    # per device row, the memory its process holds outside the breakdown (planner/llama/overhead.py): the
    # figure each row's overhead_bytes is, with its source and whether it was measured
    overheads: tuple[tuple[str, Overhead], ...] = ()
    # splits of the one-token graph as the simulated reserve's scheduler cut them; 0 for a formula estimate
    decode_splits: int = 0

    @property
    def totals(self) -> tuple[DeviceMemory, ...]:
        """Every model's rows added per device: what the process holds, and what budgets judge."""
        if not self.companions:
            return self.devices
        return summed([self.devices] + [c.devices for c in self.companions])

    @property
    def output_on_host(self) -> bool:
        """An -ot rule keeps the output matrix (a tied one under token_embd's name) in host memory."""
        return dict(self.moved).get(OUTPUT) == CPU

    def device(self, name: str) -> DeviceMemory | None:
        return next((d for d in self.devices if d.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model_path,
            "flags": shlex.join(flags_to_argv(self.flags)),   # shlex.split gives the argv back
            "devices": [_row_dict(d) for d in self.devices],
            "layers": {name: list(ls) for name, ls in self.layers},
            "output_device": self.output_device,
            "n_ctx": self.cparams.n_ctx, "n_ctx_seq": self.cparams.n_ctx_seq, "n_seq": self.cparams.n_seq,
            "n_ubatch": self.cparams.n_ubatch, "flash_attn": self.cparams.flash_attn,
            "pipeline_parallel": self.pipeline_parallel, "compute_model": self.compute_model,
            "program": self.program.value, "notes": list(self.notes),
            "compute_safety": dict(self.compute_safety),
            "overheads": overhead_dict(self.overheads),
            "decode_splits": self.decode_splits or None,
            "moved_tensors": [{"tensor": t, "to": to} for t, to in self.moved],
            "ignored_flags": list(self.flags.ignored),
            **({"meta_members": [_row_dict(d) for d in self.meta_members]} if self.meta_members else {}),
            **({"companions": [companion_dict(c) for c in self.companions],
                "totals": [_row_dict(d) for d in self.totals]} if self.companions else {}),
        }

    def to_table(self) -> str:
        rows = [[d.name, fmt_mib(d.model_bytes), fmt_mib(d.context_bytes), fmt_mib(d.compute_bytes),
                 fmt_mib(d.total_bytes), fmt_mib(d.overhead_bytes),
                 layer_ranges(dict(self.layers).get(device_of(d.name), ()), self.n_layer_all)] for d in self.devices]
        out = [f"{self.model_path}", f"n_ctx {self.cparams.n_ctx} ({self.cparams.n_stream} stream(s) of "
               f"{self.cparams.n_ctx_seq}), n_ubatch {self.cparams.n_ubatch}, flash attention "
               f"{'on' if self.cparams.flash_attn else 'off'}, output layer on {self.output_device}"
               + (", pipeline parallel" if self.pipeline_parallel else ""), "",
               table(["device", "model MiB", "context MiB", "compute MiB", "total MiB", "overhead MiB", "layers"],
                     rows, align="lrrrrrl")]
        if self.moved:
            out += ["", "tensors moved by overrides:"] + [f"  {t} -> {to}" for t, to in self.moved]
        if self.flags.ignored:
            out += ["", "ignored (no effect on memory): " + shlex.join(self.flags.ignored)]
        out += ["", compute_note(self.compute_model, self.model_arch, self.compute_safety), program_note(self.program),
                *overhead_notes(self.overheads), *split_note(self), *self.notes]
        if self.meta_members:
            out += ["", f"{META_NAME} members once really loaded (each holds its slices; the meta buffer is "
                    f"as large as its largest member's)", "", _rows_table(self.meta_members)]
        for c in self.companions:
            out += ["", f"{COMPANION_TITLES[c.kind]} {c.path}", "", _rows_table(c.devices)]
            out += [f"  {note}" for note in c.notes]
        if self.companions:
            out += ["", "all models together (what the budgets hold)", "", _rows_table(self.totals)]
        return "\n".join(out) + "\n"


PINNED_BACKENDS = (Backend.CUDA, Backend.ROCM)   # ggml-cuda's host buffer type: cudaMallocHost / hipHostMalloc

COMPANION_TITLES = {"draft": "drafter (speculative decoding)", "mmproj": "multimodal projector",
                    "lora": "LoRA adapter", "mtp": "MTP draft context (--spec-type draft-mtp) on"}


def _rows_table(rows: tuple[DeviceMemory, ...]) -> str:
    return table(["device", "model MiB", "context MiB", "compute MiB", "total MiB"],
                 [[d.name, fmt_mib(d.model_bytes), fmt_mib(d.context_bytes), fmt_mib(d.compute_bytes),
                   fmt_mib(d.total_bytes)] for d in rows], align="lrrrr")


def _row_dict(d: DeviceMemory) -> dict[str, Any]:
    return {"name": d.name, "model_bytes": d.model_bytes, "context_bytes": d.context_bytes,
            "compute_bytes": d.compute_bytes, "overhead_bytes": d.overhead_bytes}


def overhead_dict(figures: tuple[tuple[str, Overhead], ...]) -> dict[str, Any]:
    """Each row's overhead figure with its source, by row name (JSON)."""
    return {name: o.to_dict() for name, o in figures}


def split_note(est: Estimate) -> list[str]:
    """The one-token graph's split count, with seed 000's reading of a high count."""
    if not est.decode_splits:
        return []
    n_devices = sum(1 for d in est.devices if d.name not in (HOST, CPU_REPACK) and d.total_bytes)
    line = f"generation graph: {est.decode_splits} splits"
    if est.decode_splits > 2 * (n_devices + 1):
        why = ("expected here: -ot rules keep tensors of the layers on the host" if est.moved else
               "a tensor on another device than its layer's: the KV cache on the host (-nkvo), an -ot rule, or a "
               "type the device refuses")
        line += f" (seed 000 reads a high count at generation time as something misplaced; {why})"
    return [line]


def overhead_notes(figures: tuple[tuple[str, Overhead], ...]) -> list[str]:
    """One line per distinct figure: which rows carry it, who holds it, measured or assumed, and its source."""
    by_figure: dict[Overhead, list[str]] = defaultdict(list)
    for name, o in figures:
        by_figure[o].append(name)
    return [f"overhead {fmt_mib(o.bytes)} MiB on {', '.join(names)} (outside llama.cpp's breakdown, held by the "
            f"{o.process.value} on {o.backend.value}), {o.label}: {o.source}" for o, names in by_figure.items()]


def companion_dict(c: CompanionEstimate) -> dict[str, Any]:
    return {"kind": c.kind, "model": c.path, "devices": [_row_dict(d) for d in c.devices],
            "compute_model": c.compute_model, "notes": list(c.notes)}


def compute_note(source: str, arch: str, safety: tuple[tuple[str, int], ...] = ()) -> str:
    """One line saying where the compute column comes from (and the safety term it includes)."""
    if source == SIMULATED:
        return "compute: simulated (ggml's scheduler and allocator reserve, replayed)"
    line = (f"compute: formula (no graph builder for {arch or 'this model'} with these flags: "
            f"planner/memory/analytic.py's closed form, not a simulated reserve)")
    if safety:
        line += ("; it includes a safety term, a layer's working set or the graph inputs once more: "
                 + ", ".join(f"{row} {fmt_mib(n)} MiB" for row, n in safety))
    return line


def context_notes(ctx: ModelContext) -> tuple[str, ...]:
    """A line when some layers' caches are not sized: an architecture in no KV table of
    planner/model/arch.py has layers of UNKNOWN kind, and their context column is 0 where llama.cpp
    allocates a cache (planner/memory/coverage.py calls these architectures weights-only)."""
    unknown = sum(1 for lf in ctx.facts.layers if lf.kind is AttnKind.UNKNOWN)
    if not unknown:
        return ()
    return (f"context not sized: fitplan has no KV facts for {ctx.model.architecture} (planner/model/arch.py), so "
            f"the context column leaves out the caches of {unknown} of its {len(ctx.facts.layers)} layers, "
            f"which llama.cpp allocates",)


def pinned_note(settings: LlamaSettings) -> tuple[str, ...]:
    """A line when host weights land in a CUDA/ROCm build's pinned host buffer (make_cpu_buft_list puts the
    device's host buffer type first; seed 003 §1): page-locked RAM the OS can neither swap nor lend out. The
    input layer (token_embd) is not among them: it stays in the mapped CPU buffer (the H200 record's loads log
    it as CPU_Mapped)."""
    pinned = next((d for d in settings.devices if d.has_host_buffer and d.backend in PINNED_BACKENDS), None)
    if pinned is None or settings.flags.no_host:
        return ()
    slots = settings.ctx.slot_by_name
    host_weights = sum(slots[name].n_bytes for name, row in settings.placement.tensor_buft
                       if row == HOST and slots[name].layer != INPUT_LAYER)
    if not host_weights:
        return ()
    buft = f"{pinned.backend.value}_Host"
    return (f"host weights: {fmt_mib(host_weights)} MiB in {buft}, pinned (page-locked) host memory counted in the "
            f"Host row: the OS cannot swap it or give it to other processes while the model is loaded "
            f"(GGML_CUDA_NO_PINNED=1 keeps it pageable, at a slower prompt upload; seed 003 §1)",)


def program_note(program: Program) -> str:
    """One line saying which program's allocation the rows are."""
    other = Program.SERVER if program is Program.FIT_PARAMS else Program.FIT_PARAMS
    return f"sized as {PROGRAM_NAMES[program]} (--program {other.value}: {PROGRAM_NAMES[other]})"


def estimate(model: ModelLike, flags: LlamaFlags | list[str],
             inventory: Inventory | None = None, exact_compute: bool = True,
             program: Program = Program.FIT_PARAMS) -> Estimate:
    """Per-device model, context and compute bytes llama.cpp would allocate for `flags`: as
    llama-fit-params' dry run prints them, or as `program` loads them (flags given as an argument
    vector take that program's defaults: llama-server's -np)."""
    ctx = model_context(model)
    if not isinstance(flags, LlamaFlags):
        flags = parse_llama_flags(program_argv(program, list(flags)))
    return estimate_settings(resolve_settings(ctx, flags, inventory), exact_compute, inventory, program)


def _check_meta_graphs(settings: LlamaSettings) -> None:
    """-sm tensor: refuse what llama.cpp's dry run passes but its meta backend aborts on when the model
    runs (runtime/engine/meta_check.py resolves the graphs' split states)."""
    if any(d.members for d in settings.devices):
        err = meta_split_error(settings)
        if err is not None:
            raise FlagError(f"-sm tensor: llama.cpp's dry run passes, but its meta backend aborts when the model "
                            f"runs ({llama_abort(err)}; the runtime's split-state resolution: {err})")


def estimate_settings(settings: LlamaSettings, exact_compute: bool = True,
                      inventory: Inventory | None = None, program: Program = Program.FIT_PARAMS) -> Estimate:
    """The estimate of flags already resolved (validate resolves once for the estimate and its run),
    with the companions the flags name (a drafter's devices resolve against `inventory`)."""
    placement = settings.placement
    _check_meta_graphs(settings)
    weights = weight_rows(settings)
    kv = context_bytes(layer_caches(settings))
    program = effective_program(program, settings.flags)
    n_outputs_max, dry = outputs_max(program, settings.flags), dry_run(program)
    compute, source = compute_model(settings, use_runtime=exact_compute, dry_run=dry, n_outputs_max=n_outputs_max)
    # an architecture without a graph builder is estimated by the formula alone: it carries the
    # formula's stated safety term (a builder's quick formula pass, which the simulated reserve
    # judges afterwards, does not)
    safety = formula_safety(settings, n_outputs_max) if source == FORMULA and not supported(settings) else {}
    compute = {row: n + safety.get(row, 0) for row, n in compute.items()}
    kernels = (decode_kernels(settings, n_outputs_max, dry_run=dry) or {}) if source == SIMULATED else {}
    splits = (decode_splits(settings, n_outputs_max, dry_run=dry) or 0) if source == SIMULATED else 0
    meta = next((d.name for d in settings.devices if d.members), None)
    members = member_rows(settings, compute.get(meta, 0), inventory) if meta else ()
    names = [d.name for d in settings.devices] + [HOST] + ([CPU_REPACK] if weights.get(CPU_REPACK) else [])
    held = overheads(settings.devices, inventory)
    rows = tuple(DeviceMemory(n, weights.get(n, 0), kv.get(n, 0), compute.get(n, 0),
                              held[n].bytes if n in held else 0) for n in names)
    by_dev: dict[str, list[int]] = defaultdict(list)
    for il, d in enumerate(placement.layer_device):
        by_dev[d].append(il)
    return Estimate(settings.ctx.model.path, settings.flags, settings.cparams, rows,
                    tuple((d, tuple(ls)) for d, ls in by_dev.items()), placement.layer_device[-1], placement.moved,
                    placement.pipeline_parallel, settings.ctx.facts.n_layer_all, source,
                    settings.ctx.model.architecture,
                    estimate_companions(settings, inventory, exact_compute) if settings.flags.has_companions else (),
                    members, tuple(sorted(kernels.items())), program,
                    context_notes(settings.ctx) + pinned_note(settings),
                    tuple((row, safety[row]) for row in names if safety.get(row)),
                    tuple(held.items()) + _member_overheads(settings, inventory), splits)


def _member_overheads(settings: LlamaSettings, inventory: Inventory | None) -> tuple[tuple[str, Overhead], ...]:
    """-sm tensor: each real device behind the meta row holds its own overhead."""
    return tuple((m.name, o) for d in settings.devices for m in d.members
                 if (o := device_overhead(m, inventory)) is not None)
