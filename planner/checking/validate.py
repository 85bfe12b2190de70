"""`fitplan validate`: run a model under a plan (or llama.cpp flags) and check the estimate.

The embedded engine (runtime/) loads the weights into per-device buffers whose capacity is the
device's budget, runs a fixed prompt of token ids and a greedy continuation, and reports per
device the weights, KV and peak compute bytes it really allocated, the split counts of the
prompt and of one generated token, the bytes copied per generated token and the time spent per
split, next to what `fitplan estimate` predicted. An allocation past a budget is a verdict
("does not fit on RPC0 by 12.0 MiB"), not an error. The llama.cpp engine
(planner/running/validate_llama.py) runs the same check with the real tools on loopback, after the same
preparation (prepare_validation).
"""
from __future__ import annotations

import logging
import shlex
import time
from dataclasses import replace
from typing import Any

import numpy as np
from gguf import Keys

from planner.checking.allreduce_report import AllReduceReport, allreduce_report
from planner.checking.resident import check_resident, peak_rss_bytes
from planner.checking.validation_report import (
    DEFAULT_GEN_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    DeviceReport,
    ValidateReport,
    ValidateRequest,
    judge,
    prompt_ids,
    with_budgets,
)
from planner.core.choices import Engine
from planner.core.errors import BadInput
from planner.core.units import fmt_mib
from planner.emit.document import Deployment, read_deployment
from planner.gguf.reader import ModelFile, read_model, require_weights
from planner.hardware.budgets import resolve_budgets
from planner.hardware.inventory import Inventory
from planner.hardware.inventory_yaml import load_inventory
from planner.llama.companions import server_target_outputs_max
from planner.llama.context import ModelContext, model_context
from planner.llama.flags import flags_to_argv, parse_llama_flags
from planner.llama.placement import CPU, HOST, HOST_ROWS, device_of, row_of
from planner.llama.programs import Program
from planner.llama.settings import LlamaSettings, resolve_settings
from planner.memory.estimate import Estimate, estimate_settings
from planner.registry.examples import resolve_model
from runtime.engine.reserve import supported
from runtime.engine.runner import ModelRunner, StepRecord
from runtime.ggml.sched_errors import BufferAllocationError

log = logging.getLogger(__name__)



def target_rows(est: Estimate) -> dict[str, tuple[int, int, int]]:
    """Estimate rows keyed as the runtime names devices: Host and CPU_REPACK are both the CPU."""
    out: dict[str, tuple[int, int, int]] = {}
    for d in est.devices:
        name = HOST if d.name in HOST_ROWS else d.name
        m, c, k = out.get(name, (0, 0, 0))
        out[name] = (m + d.model_bytes, c + d.context_bytes, k + d.compute_bytes)
    return out


def server_predicted(settings: LlamaSettings, inventory: Inventory | None = None) -> dict[str, tuple[int, int, int]]:
    """The target's rows as llama-server loads them (planner/llama/programs.py), keyed as the runtime names
    devices."""
    return target_rows(estimate_settings(settings, inventory=inventory, program=Program.SERVER))


def validate(req: ValidateRequest, engine: str = "embedded", kernels: str = "default",
             reserve_only: bool = False) -> ValidateReport:
    """The embedded engine's check (llama.cpp's runs in planner/running/validate_llama.py).
    kernels: "default" float32 kernels, or "ggml-avx2", which reproduce llama.cpp's portable x86-64
    CPU build bit for bit (runtime/ggml/exact.py), several times slower.
    reserve_only: build the graphs, run the passes, cut the splits and reserve the buffers against
    the budgets without reading a weight or computing a token (seconds, bounded memory); the only
    form a header-only file or a URL can take."""
    chosen = Engine(engine)
    if chosen is Engine.LLAMA_CPP and not reserve_only:
        raise ValueError("the llama.cpp engine runs llama-server: planner.running.validate_llama")
    _, settings, est = prepare_validation(req, chosen, reserve_only)
    held, note = _companions_held(req, est)
    if reserve_only:
        report = _validate_reserve(held, settings, target_rows(est))
    else:
        check_resident(settings.ctx.model, est)   # before a byte is allocated: one line and exit 1 past MemAvailable
        report = _validate_embedded(held, settings, target_rows(est), kernels)
    return replace(report, notes=report.notes + ((note,) if note else ()) + overhead_note(est),
                   peak_rss_bytes=peak_rss_bytes())


def prepare_validation(req: ValidateRequest, engine: Engine,
                       reserve_only: bool = False) -> tuple[ModelContext, LlamaSettings, Estimate]:
    """What either engine checks first: the model (with weights, unless reserve_only), its settings
    resolved once (the estimate and the run share them), the estimate of the plan's llama-server
    line, and a prompt that fits its context."""
    if reserve_only and engine is not Engine.EMBEDDED:
        raise BadInput("--reserve-only runs the embedded engine's scheduler and allocator: drop --engine llama.cpp")
    ctx = model_context(req.model_file or resolve_model(req.model))
    if not reserve_only:   # it loads and runs the weights: a header-only file or a URL is not enough
        require_weights(ctx.model, "validate" if engine is Engine.EMBEDDED else "validate --engine llama.cpp")
    settings = resolve_settings(ctx, req.flags, req.inventory)
    # what the plan's llama-server line loads: its output rows and a real reserve (planner/llama/programs.py)
    est = estimate_settings(settings, inventory=req.inventory, program=Program.SERVER)
    if req.n_prompt + req.n_gen > est.cparams.n_ctx:
        raise BadInput(f"--prompt-tokens {req.n_prompt} + --gen-tokens {req.n_gen} do not fit the context "
                       f"of {est.cparams.n_ctx} tokens")
    return ctx, settings, est


def overhead_note(est: Estimate) -> tuple[str, ...]:
    """The overhead a plan counts beside these rows (planner/llama/overhead.py): not allocated by the embedded
    engine, and not in llama.cpp's breakdown either, so the rows here leave it out."""
    if not est.overheads:
        return ()
    parts = ", ".join(f"{name} {fmt_mib(o.bytes)} MiB ({o.label})" for name, o in est.overheads)
    return (f"not in these rows: the overhead outside llama.cpp's breakdown that a plan counts within the budget: "
            f"{parts}",)


def _companions_held(req: ValidateRequest, est: Estimate) -> tuple[ValidateRequest, str]:
    """The embedded engine runs the target alone: a drafter's, projector's or adapter's estimated rows
    are held back from the budgets it runs under, and the report says so."""
    if not est.companions:
        return req, ""
    held: dict[str, int] = {}
    for c in est.companions:
        for d in c.devices:
            row = HOST if d.name in HOST_ROWS else d.name
            held[row] = held.get(row, 0) + d.total_bytes
    budgets = {row: b - held.get(row, 0) for row, b in req.budgets.items()}
    parts = ", ".join(f"{row} {fmt_mib(n)} MiB" for row, n in held.items() if n)
    return (replace(req, budgets=budgets),
            f"companions ({', '.join(c.kind for c in est.companions)}) not run by the embedded engine: their "
            f"estimated bytes ({parts}) are held back from the budgets shown")


def _no_fit(ctx_path: str, flags_text: str, e: BufferAllocationError, executed: bool) -> ValidateReport:
    name = row_of(e.device)
    return ValidateReport("embedded", ctx_path, flags_text, (), 0, 0, 0, 0.0, 0.0, 0.0,
                          f"does not fit on {name} by {fmt_mib(e.shortfall_bytes)} MiB", False, (str(e),),
                          executed)


def _as_served(settings: LlamaSettings) -> dict[str, Any]:
    """The runtime's reserve as llama-server makes it: its output rows, and a real (not dry-run) reserve."""
    return {"n_outputs_max": server_target_outputs_max(settings.flags), "dry_run": False}


def _validate_reserve(req: ValidateRequest, settings: LlamaSettings,
                      predicted: dict[str, tuple[int, int, int]]) -> ValidateReport:
    """The load and llama.cpp's reserve under the budgets, with sizes only: weights and caches get
    addresses in buffers that are never touched, and no graph is computed."""
    if not supported(settings):
        raise BadInput(f"--reserve-only: the runtime has no graph builder for {settings.ctx.model.architecture}")
    capacities = {device_of(k): v for k, v in req.budgets.items()}
    flags_text = shlex.join(flags_to_argv(req.flags))
    try:
        runner = ModelRunner.from_settings(settings, capacities, weights=False, **_as_served(settings))
    except BufferAllocationError as e:
        return _no_fit(settings.ctx.model.path, flags_text, e, executed=False)
    assert runner.reserve_report is not None
    compute = runner.compute_bytes()
    devices = tuple(DeviceReport(row_of(name), runner.weight_bytes.get(name, 0), runner.kv_bytes.get(name, 0),
                                 compute.get(name, 0), predicted.get(row_of(name)), req.budgets.get(row_of(name)), 0.0)
                    for name in [d.name for d in runner.placement.devices] + [CPU])
    verdict = judge(devices, uma_pool_bytes=req.uma_pool_bytes, pool_devices=req.pool_devices)
    rr = runner.reserve_report
    return ValidateReport("embedded", settings.ctx.model.path, flags_text, devices, rr.n_splits_pp, rr.n_splits_tg,
                          None, 0.0, 0.0, 0.0, verdict.text, verdict.fits, verdict.notes, executed=False)


def _validate_embedded(req: ValidateRequest, settings: LlamaSettings, predicted: dict[str, tuple[int, int, int]],
                       kernels: str = "default") -> ValidateReport:
    ctx = settings.ctx
    capacities = {device_of(k): v for k, v in req.budgets.items()}
    flags_text = shlex.join(flags_to_argv(req.flags))
    try:
        runner = ModelRunner.from_settings(settings, capacities, kernels=kernels, **_as_served(settings))
        runner.dequantize_weights()  # the prompt times compute, not first-use dequantization (as the cache holds)
        bos = ctx.model.metadata.get(Keys.Tokenizer.BOS_ID)
        prompt = prompt_ids(req.n_prompt, runner.hp.n_vocab, bos)
        t0 = time.perf_counter()
        logits = runner.decode(prompt, all_logits=False)
        t_prompt = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(req.n_gen):
            logits = runner.decode([int(logits[-1].argmax())], all_logits=False)
        t_gen = time.perf_counter() - t0
    except BufferAllocationError as e:
        return _no_fit(ctx.model.path, flags_text, e, executed=True)
    # the run computes what the header says: an rms eps of 0 or overflowing weights give NaN, as in ggml
    finite = () if np.isfinite(logits).all() else (
        "the last logits are not all finite (NaN or inf): the weights or the header's numbers (an rms eps of 0, "
        "say) make this model compute garbage, in llama.cpp too",)
    gen_steps = runner.steps[1:] or runner.steps
    compute = runner.compute_bytes()
    devices = []
    for name in [d.name for d in runner.placement.devices] + [CPU]:
        row = row_of(name)
        seconds = sum(s.split_seconds.get(name, 0.0) for s in gen_steps) / max(1, len(gen_steps))
        devices.append(DeviceReport(row, runner.weight_bytes.get(name, 0), runner.kv_bytes.get(name, 0),
                                    compute.get(name, 0), predicted.get(row), req.budgets.get(row), seconds))
    verdict = judge(tuple(devices), uma_pool_bytes=req.uma_pool_bytes, pool_devices=req.pool_devices)
    n_split_gen = gen_steps[-1].measurement.n_splits
    return ValidateReport(
        "embedded", ctx.model.path, flags_text, tuple(devices), runner.steps[0].measurement.n_splits, n_split_gen,
        sum(s.measurement.copied_bytes for s in gen_steps) // max(1, len(gen_steps)),
        sum(s.seconds for s in gen_steps) / max(1, len(gen_steps)) / max(1, n_split_gen),
        len(prompt) / t_prompt, req.n_gen / t_gen if t_gen else 0.0, verdict.text, verdict.fits,
        verdict.notes + finite, allreduce=_allreduce(runner, gen_steps))


def _allreduce(runner: ModelRunner, gen_steps: list[StepRecord]) -> AllReduceReport | None:
    """-sm tensor: the AllReduces of a generated token (the last one-token step), beside llama.cpp's."""
    step = gen_steps[-1]
    metas = [d for d in runner.placement.devices if d.members]
    if step.reduces is None or not metas:
        return None
    # the layers on the meta device (with -ngl below full offload the others run on the CPU, unreduced)
    n_layer = sum(1 for dev in runner.placement.layer_device[:runner.hp.n_layer] if dev == metas[0].name)
    return allreduce_report(len(metas[0].members), n_layer, runner.hp.n_embd, step.reduces.n_reduces,
                            step.reduces.bytes_moved)


# --- plan files ---------------------------------------------------------------------------------

def load_plan(path: str, n_prompt: int = DEFAULT_PROMPT_TOKENS, n_gen: int = DEFAULT_GEN_TOKENS) -> ValidateRequest:
    """A request from `fitplan plan -o plan.yaml`'s deployment file (planner/emit/document.py)."""
    doc = read_deployment(path)
    mf = _check_header(path, doc)
    return ValidateRequest(doc.model_path, doc.flags, doc.inventory, doc.budgets, n_prompt, n_gen, mf,
                           doc.uma_pool_bytes, doc.pool_devices)


def validate_request(target: str, flags: list[str], devices: str | None = None, max_vram: str | None = None,
                     n_prompt: int = DEFAULT_PROMPT_TOKENS, n_gen: int = DEFAULT_GEN_TOKENS) -> ValidateRequest:
    """A plan file (.yaml/.yml) with no flags after it, or a model with llama.cpp flags."""
    if target.endswith((".yaml", ".yml")):
        if flags or devices or max_vram:
            raise BadInput("a plan file carries its own flags, inventory and budgets: give nothing else")
        return load_plan(target, n_prompt, n_gen)
    if devices:
        inventory = load_inventory(devices)
        req = ValidateRequest(target, parse_llama_flags(flags), inventory, n_prompt=n_prompt, n_gen=n_gen)
        return with_budgets(req, resolve_budgets(inventory, max_vram))
    if max_vram:
        raise BadInput("--max-vram needs --devices (budgets are relative to an inventory)")
    return ValidateRequest(target, parse_llama_flags(flags), None, {}, n_prompt, n_gen)


def _check_header(path: str, doc: Deployment) -> ModelFile:
    """The plan's model, read once (validate reuses it), checked against the recorded hash."""
    mf = read_model(doc.model_path)
    if doc.header_sha256 and mf.header_bytes and mf.header_sha256 != doc.header_sha256:
        raise BadInput(f"{path}: {doc.model_path} is not the model the plan was made for (header sha256 differs)")
    return mf
