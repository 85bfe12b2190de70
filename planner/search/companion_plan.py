"""Companion models placed with the target: where the drafter and the projector go, and what they move.

A plan with companions is the target's plan under budgets that hold every model's rows
(`Estimate.totals`): the solver sees the drafter's and the projector's bytes as fixed on their
devices, and the estimate judges the sum. What the planner decides here is where each companion
goes — the drafter on one device (seed 003 §4: the device holding the target's last layers, where
the drafted tokens' verification ends; an unpinned drafter follows -dev and -ts, and under
`-sm tensor` joins the meta device) or in host memory; the projector on one device or on the host
(`--no-mmproj-offload`) — by planning each arrangement and ranking what holds.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from planner.core.errors import BadInput
from planner.core.units import fmt_bytes
from planner.hardware.inventory import Inventory
from planner.llama.context import ModelContext, model_context
from planner.llama.flags import DRAFT_MTP, NGL_AUTO, DraftFlags, LlamaFlags, LoraArg, MmprojFlags, SpecFlags
from planner.llama.placement import CPU, HOST, HOST_ROWS
from planner.memory.draft import speculation_refusal
from planner.memory.estimate import Estimate
from planner.memory.mtp import check_mtp
from planner.memory.rows import CompanionEstimate
from planner.registry.examples import resolve_model
from planner.search.result import Companions, PlanRequest
from planner.speed.throughput import Rates

HOST_PLACE = "none"   # llama.cpp's spelling of "no device" in -devd and -mmdev


def companion_flags(base: LlamaFlags, c: Companions) -> LlamaFlags:
    """The target's flags with the companions' own: -md/-devd/-ctkd/-ctvd/--spec-draft-n-max/--spec-type
    (--spec-type draft-mtp with -ctkd/-ctvd/--spec-draft-n-max for the MTP block),
    -mm with -mmdev or --no-mmproj-offload, --lora."""
    spec, mmproj = SpecFlags(), MmprojFlags()
    if c.mtp:   # the MTP context takes the drafter's cache types and draft length (common_base_params_to_speculative)
        spec = SpecFlags(types=("none", DRAFT_MTP), draft=DraftFlags(
            cache_type_k=c.draft_cache_type, cache_type_v=c.draft_cache_type, n_max=c.draft_max))
    if c.draft:
        devices = None if c.draft_device is None else (c.draft_device,)
        spec = SpecFlags(types=("none", c.spec_type), draft=DraftFlags(
            model=c.draft, n_gpu_layers=NGL_AUTO, devices=devices, cache_type_k=c.draft_cache_type,
            cache_type_v=c.draft_cache_type, n_max=c.draft_max))
    if c.mmproj:
        on_host = c.mmproj_device == HOST_PLACE
        mmproj = MmprojFlags(path=c.mmproj, use_gpu=not on_host,
                             device=None if on_host else c.mmproj_device)
    return replace(base, spec=spec, mmproj=mmproj, loras=tuple(LoraArg(p) for p in c.loras))


def resolved_companions(c: Companions, target: ModelContext, inventory: Inventory) -> Companions:
    """The request with every companion path as llama.cpp must be given it (example: and hub names
    resolved), a drafter llama.cpp would refuse for speculation refused here (BadInput: the reason),
    and named devices checked against the inventory."""
    if c.mtp and c.draft:
        raise BadInput("--mtp and --draft: llama-server drafts with one of them; choose the model's MTP block or "
                       "the drafter")
    if c.mtp:
        check_mtp(target)
    names = set(inventory.names) | {HOST_PLACE}
    for flag, dev in (("--draft-device", c.draft_device), ("--mmproj-device", c.mmproj_device)):
        if dev is not None and dev not in names:
            raise BadInput(f"{flag} {dev!r}: not a device of this inventory ({', '.join(sorted(names))})")
    draft = c.draft
    if draft:
        dctx = model_context(draft)
        reason = speculation_refusal(target, dctx)
        if reason:
            raise BadInput(f"--draft {draft}: llama.cpp would refuse it for speculation: {reason}")
        draft = dctx.model.path
    mmproj = resolve_model(c.mmproj) if c.mmproj else None
    return replace(c, draft=draft, mmproj=mmproj, loras=tuple(resolve_model(p) for p in c.loras))


def arrangements(c: Companions, inventory: Inventory) -> list[Companions]:
    """Every placement of the companions the planner tries: each undecided one on each device, last
    device first (llama.cpp gives the output layer to the last device with layers), then the host."""
    places = [d.name for d in reversed(inventory.devices)] + [HOST_PLACE]
    drafts = [c.draft_device] if c.draft is None or c.draft_device is not None else places
    projectors = [c.mmproj_device] if c.mmproj is None or c.mmproj_device is not None else places
    return [replace(c, draft_device=d, mmproj_device=m) for d in drafts for m in projectors]


@dataclass(frozen=True)
class Ranked:
    """One arrangement's plan, judged: the target's decode seconds per token plus the drafter's
    per drafted token times the draft length (each model's weights streamed from where they live)."""

    step_s: float
    on_last: bool       # the drafter shares the device of the target's last layers (seed 003 §4)


def draft_token_seconds(draft: CompanionEstimate, inventory: Inventory) -> float:
    """Seconds to stream the drafter's weights once, from the rows they live in."""
    rates = Rates(inventory)
    return sum(d.model_bytes / rates.bandwidth(CPU if d.name in HOST_ROWS else d.name) for d in draft.devices)


def rank(est: Estimate, target_decode_tokens_s: float, req: PlanRequest, inventory: Inventory) -> Ranked:
    draft = next((c for c in est.companions if c.kind == "draft"), None)
    step = 1.0 / max(target_decode_tokens_s, 1e-9)
    if draft is None:
        return Ranked(step, True)
    step += req.companions.draft_max * draft_token_seconds(draft, inventory)
    device = req.companions.draft_device
    return Ranked(step, device == est.output_device or (device == HOST_PLACE and est.output_device == CPU))


def swing_lines(with_c: Estimate, without: Estimate | None) -> list[str]:
    """What the companions cost on each device, and the layers they moved compared with the target's
    plan alone: "the drafter's KV (1.0 GiB on RPC1) moves 4 layers from RPC1 to RPC0"."""
    lines = []
    for c in with_c.companions:
        for d in c.devices:
            if d.total_bytes:
                lines.append(f"{_name(c.kind)} on {d.name}: weights {fmt_bytes(d.model_bytes)}, context "
                             f"{fmt_bytes(d.context_bytes)}, compute {fmt_bytes(d.compute_bytes)}")
    if without is None:
        return lines + ["the target alone does not fit these budgets either way"]
    before = {dev: len(ls) for dev, ls in without.layers}
    after = {dev: len(ls) for dev, ls in with_c.layers}
    lost = {dev: before.get(dev, 0) - after.get(dev, 0) for dev in before if before.get(dev, 0) > after.get(dev, 0)}
    gained = {dev: after[dev] - before.get(dev, 0) for dev in after if after[dev] > before.get(dev, 0)}
    if not lost:
        return lines + ["the companions move no layer of the target"]
    for dev, n in lost.items():
        to = ", ".join(_where(g) for g in gained) or "nowhere"
        lines.append(f"{_biggest(with_c.companions, dev)} moves {n} layer{'s' if n != 1 else ''} "
                     f"from {_where(dev)} to {to}")
    return lines


def _where(dev: str) -> str:
    return HOST if dev == CPU else dev


def _name(kind: str) -> str:
    return {"draft": "the drafter", "mmproj": "the projector", "lora": "the adapters",
            "mtp": "the MTP draft context"}[kind]


def _biggest(companions: tuple[CompanionEstimate, ...], dev: str) -> str:
    """The largest companion part on a device: "the drafter's KV (1.0 GiB on RPC1)"."""
    row = HOST if dev == CPU else dev
    best: tuple[int, str] = (0, "the companions")
    for c in companions:
        for d in c.devices:
            if d.name != row:
                continue
            parts = ((d.context_bytes, "KV"), (d.model_bytes, "weights"), (d.compute_bytes, "compute buffer"))
            for size, part in parts:
                best = max(best, (size, f"{_name(c.kind)}'s {part}"))
    size, what = best
    return f"{what} ({fmt_bytes(size)} on {row})" if size else what
