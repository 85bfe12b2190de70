"""`fitplan validate`: run a model under a plan (or llama.cpp flags) and check the estimate.

The embedded engine (runtime/) loads the weights into per-device buffers whose capacity is the
device's budget, runs a fixed prompt of token ids and a greedy continuation, and reports per
device the weights, KV and peak compute bytes it really allocated, the split counts of the
prompt and of one generated token, the bytes copied per generated token and the time spent per
split, next to what `fitplan estimate` predicted. An allocation past a budget is a verdict
("does not fit on RPC0 by 12.0 MiB"), not an error. The llama.cpp engine (validate_llama)
runs the same check with the real tools on loopback.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import yaml

from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.core.errors import BadInput
from planner.memory.estimate import Estimate, estimate, model_context
from planner.gguf.examples import resolve_model
from planner.llama.flags import LlamaFlags, flags_to_argv, parse_llama_flags
from planner.llama.placement import CPU_REPACK, HOST
from planner.core.render import table
from planner.core.units import fmt_bytes, fmt_mib

log = logging.getLogger(__name__)

DEFAULT_PROMPT_TOKENS = 32
DEFAULT_GEN_TOKENS = 16
COMPUTE_TOLERANCE = 0.05   # the bar for the compute column
ENGINES = ("embedded", "llama.cpp")


@dataclass(frozen=True)
class ValidateRequest:
    model: str
    flags: LlamaFlags
    inventory: Inventory | None = None
    budgets: dict[str, int] = field(default_factory=dict)   # device name or Host -> bytes
    n_prompt: int = DEFAULT_PROMPT_TOKENS
    n_gen: int = DEFAULT_GEN_TOKENS
    model_file: Any = field(default=None, repr=False, compare=False)   # the header, when already read


@dataclass(frozen=True)
class DeviceReport:
    name: str
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    predicted: tuple[int, int, int] | None      # (model, context, compute) from the estimate
    budget_bytes: int | None
    seconds_per_token: float                    # time in this device's splits per generated token

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes


@dataclass(frozen=True)
class ValidateReport:
    engine: str
    model: str
    flags: str
    devices: tuple[DeviceReport, ...]
    n_splits_prompt: int
    n_splits_gen: int
    copied_bytes_per_token: int | None      # None: the engine does not report it (llama.cpp)
    seconds_per_split: float
    prompt_tokens_s: float
    gen_tokens_s: float
    verdict: str
    fits: bool
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine, "model": self.model, "flags": self.flags, "verdict": self.verdict,
            "fits": self.fits,
            "devices": [{"name": d.name, "weights_bytes": d.weights_bytes, "kv_bytes": d.kv_bytes,
                         "compute_bytes": d.compute_bytes, "budget_bytes": d.budget_bytes,
                         "predicted": None if d.predicted is None else
                         dict(zip(("model_bytes", "context_bytes", "compute_bytes"), d.predicted)),
                         "seconds_per_token": round(d.seconds_per_token, 6)} for d in self.devices],
            "splits": {"prompt": self.n_splits_prompt, "generation": self.n_splits_gen},
            "copied_bytes_per_token": self.copied_bytes_per_token,
            "seconds_per_split": round(self.seconds_per_split, 6),
            "prompt_tokens_s": round(self.prompt_tokens_s, 2), "gen_tokens_s": round(self.gen_tokens_s, 2),
            "notes": list(self.notes),
        }

    def to_table(self) -> str:
        def pred(d: DeviceReport, i: int) -> str:
            return "-" if d.predicted is None else fmt_mib(d.predicted[i])

        rows = [[d.name, fmt_mib(d.weights_bytes), pred(d, 0), fmt_mib(d.kv_bytes), pred(d, 1),
                 fmt_mib(d.compute_bytes), pred(d, 2), "-" if d.budget_bytes is None else fmt_mib(d.budget_bytes),
                 f"{d.seconds_per_token * 1e3:.1f}" if d.seconds_per_token else "-"] for d in self.devices]
        copied = "-" if self.copied_bytes_per_token is None else fmt_bytes(self.copied_bytes_per_token)
        lines = [f"{self.model} [{self.engine}] {self.flags}"]
        if not self.devices:
            return "\n".join(lines + [f"note: {n}" for n in self.notes] + ["", f"verdict: {self.verdict}"]) + "\n"
        lines += ["", table(["device", "weights MiB", "(pred)", "KV MiB", "(pred)", "compute MiB", "(pred)",
                        "budget MiB", "ms/token"], rows, align="lrrrrrrrr"), "",
                 f"splits: prompt {self.n_splits_prompt}, generation {self.n_splits_gen}; "
                 f"copied per token {copied}; "
                 f"{self.seconds_per_split * 1e3:.2f} ms per split",
                 f"speed: prompt {self.prompt_tokens_s:.1f} tokens/s, generation {self.gen_tokens_s:.1f} tokens/s"]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines + ["", f"verdict: {self.verdict}"]) + "\n"


def prompt_ids(n: int, n_vocab: int, bos: int | None) -> list[int]:
    """A fixed token-id prompt: BOS, then ids spread over the vocabulary (deterministic)."""
    start = [bos] if bos is not None and 0 <= bos < n_vocab else []
    return (start + [(1000 + 7919 * i) % n_vocab for i in range(n)])[:n]


def _predicted(est: Estimate) -> dict[str, tuple[int, int, int]]:
    """Estimate rows keyed as the runtime names devices: Host and CPU_REPACK are both the CPU."""
    out: dict[str, tuple[int, int, int]] = {}
    for d in est.devices:
        name = HOST if d.name in (HOST, CPU_REPACK) else d.name
        m, c, k = out.get(name, (0, 0, 0))
        out[name] = (m + d.model_bytes, c + d.context_bytes, k + d.compute_bytes)
    return out


def _server_predicted(ctx: Any, req: ValidateRequest, est: Estimate) -> dict[str, tuple[int, int, int]]:
    """The estimate, with compute re-reserved for llama-server's single output row where the
    runtime has a graph builder (the estimate, like llama-fit-params, reserves n_batch rows)."""
    from runtime.engine.runner import ModelRunner
    from runtime.engine.reserve import supported

    predicted = _predicted(est)
    try:
        runner = ModelRunner.load(ctx, req.flags, req.inventory, reserve=False, weights=False, n_outputs_max=1)
    except BadInput:   # settings the runtime does not run (quantized caches): the estimate as it is
        return predicted
    if not supported(ctx, req.flags, runner.cp, runner.placement):
        return predicted
    compute = {(HOST if k == "CPU" else k): v for k, v in runner.reserve().compute_bytes.items()}
    return {row: (m, c, compute.get(row, k)) for row, (m, c, k) in predicted.items()}


def _judge(devices: tuple[DeviceReport, ...], slack: int = 0) -> tuple[str, bool, tuple[str, ...]]:
    """Verdict and notes; `slack` bytes absorb an engine's rounding of weights/KV (llama.cpp logs
    MiB with two decimals)."""
    over = [(d.name, d.total_bytes - d.budget_bytes) for d in devices
            if d.budget_bytes is not None and d.total_bytes > d.budget_bytes]
    if over:
        name, by = max(over, key=lambda x: x[1])
        return f"does not fit on {name} by {fmt_mib(by)} MiB", False, ()
    notes = []
    for d in devices:
        if d.predicted is None:
            continue
        pm, pc, pk = d.predicted
        if abs(pm - d.weights_bytes) > slack or abs(pc - d.kv_bytes) > slack:
            notes.append(f"{d.name}: weights/KV differ from the estimate "
                         f"({fmt_mib(d.weights_bytes)}/{fmt_mib(d.kv_bytes)} vs {fmt_mib(pm)}/{fmt_mib(pc)} MiB)")
        if abs(d.compute_bytes - pk) > COMPUTE_TOLERANCE * max(pk, d.compute_bytes, 1):
            notes.append(f"{d.name}: compute {fmt_mib(d.compute_bytes)} MiB vs estimated {fmt_mib(pk)} MiB")
    budgets = any(d.budget_bytes is not None for d in devices)
    verdict = "fits" + ("" if budgets else " (no budgets given: capacities unlimited)")
    return verdict + ("; the estimate is off, see notes" if notes else "; matches the estimate"), True, tuple(notes)


def validate(req: ValidateRequest, engine: str = "embedded", kernels: str = "default") -> ValidateReport:
    """kernels (embedded engine): "default" float32 kernels, or "ggml-avx2", which reproduce
    llama.cpp's portable x86-64 CPU build bit for bit (runtime/ggml/exact.py), several times slower."""
    if engine not in ENGINES:
        raise BadInput(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
    ctx = model_context(req.model_file or resolve_model(req.model))
    est = estimate(ctx, req.flags, req.inventory)
    if req.n_prompt + req.n_gen > est.cparams.n_ctx:
        raise BadInput(f"--prompt-tokens {req.n_prompt} + --gen-tokens {req.n_gen} do not fit the context "
                       f"of {est.cparams.n_ctx} tokens")
    if engine == "llama.cpp":
        from planner.checking.llama import validate_llama

        return validate_llama(req, ctx, _server_predicted(ctx, req, est))
    return _validate_embedded(req, ctx, _predicted(est), kernels)


def _validate_embedded(req: ValidateRequest, ctx: Any, predicted: dict[str, tuple[int, int, int]],
                       kernels: str = "default") -> ValidateReport:
    from runtime.ggml.sched_errors import BufferAllocationError
    from runtime.engine.runner import ModelRunner

    capacities = {("CPU" if k == HOST else k): v for k, v in req.budgets.items()}
    flags_text = " ".join(flags_to_argv(req.flags))
    try:
        runner = ModelRunner.load(ctx, req.flags, req.inventory, capacities, kernels=kernels)
        runner.dequantize_weights()  # so the prompt's time is compute, not first-use dequantization
        bos = ctx.model.metadata.get("tokenizer.ggml.bos_token_id")
        prompt = prompt_ids(req.n_prompt, runner.hp.n_vocab, bos)
        t0 = time.perf_counter()
        logits = runner.decode(prompt, all_logits=False)
        t_prompt = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(req.n_gen):
            logits = runner.decode([int(logits[-1].argmax())], all_logits=False)
        t_gen = time.perf_counter() - t0
    except BufferAllocationError as e:
        name = HOST if e.device == "CPU" else e.device
        return ValidateReport("embedded", ctx.model.path, flags_text, (), 0, 0, 0, 0.0, 0.0, 0.0,
                              f"does not fit on {name} by {fmt_mib(e.shortfall_bytes)} MiB", False, (str(e),))
    gen_steps = runner.steps[1:] or runner.steps
    compute = runner.compute_bytes()
    devices = []
    for name in [d.name for d in runner.placement.devices] + ["CPU"]:
        row = HOST if name == "CPU" else name
        seconds = sum(s.split_seconds.get(name, 0.0) for s in gen_steps) / max(1, len(gen_steps))
        devices.append(DeviceReport(row, runner.weight_bytes.get(name, 0), runner.kv_bytes.get(name, 0),
                                    compute.get(name, 0), predicted.get(row), req.budgets.get(row), seconds))
    verdict, fits, notes = _judge(tuple(devices))
    n_split_gen = gen_steps[-1].measurement.n_splits
    return ValidateReport(
        "embedded", ctx.model.path, flags_text, tuple(devices), runner.steps[0].measurement.n_splits, n_split_gen,
        sum(s.measurement.copied_bytes for s in gen_steps) // max(1, len(gen_steps)),
        sum(s.seconds for s in gen_steps) / max(1, len(gen_steps)) / max(1, n_split_gen),
        len(prompt) / t_prompt, req.n_gen / t_gen if t_gen else 0.0, verdict, fits, notes)


# --- plan files ---------------------------------------------------------------------------------

def _inventory(doc: dict[str, Any]) -> Inventory:
    devices = []
    for row in doc.get("devices") or []:
        fields = dict(row)
        fields["kind"], fields["backend"] = DeviceKind(fields["kind"]), Backend(fields["backend"])
        devices.append(DeviceSpec(**fields))
    return Inventory(tuple(devices), HostSpec(**doc["host"]), source="plan")


def load_plan(path: str, n_prompt: int = DEFAULT_PROMPT_TOKENS, n_gen: int = DEFAULT_GEN_TOKENS) -> ValidateRequest:
    """A request from `fitplan plan -o plan.yaml`'s deployment file (planner/planning/report.py)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        model = doc["model"]["path"]
        flags = parse_llama_flags(str(doc["flags"]).split())
        inventory = _inventory(doc["inventory"]) if doc.get("inventory") else None
        budgets = {str(k): int(v) for k, v in (doc.get("budgets", {}).get("devices") or {}).items()}
        if doc.get("budgets", {}).get("host_bytes"):
            budgets[HOST] = int(doc["budgets"]["host_bytes"])
    except OSError as e:
        raise BadInput(f"{path}: cannot read the plan: {e.strerror}") from None
    except (yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise BadInput(f"{path}: not a fitplan plan file ({type(e).__name__}: {e})") from None
    mf = _check_header(path, doc, model)
    return ValidateRequest(model, flags, inventory, budgets, n_prompt, n_gen, mf)


def validate_request(target: str, flags: list[str], devices: str | None = None, max_vram: str | None = None,
                     n_prompt: int = DEFAULT_PROMPT_TOKENS, n_gen: int = DEFAULT_GEN_TOKENS) -> ValidateRequest:
    """A plan file (.yaml/.yml) with no flags after it, or a model with llama.cpp flags."""
    if target.endswith((".yaml", ".yml")):
        if flags or devices or max_vram:
            raise BadInput("a plan file carries its own flags, inventory and budgets: give nothing else")
        return load_plan(target, n_prompt, n_gen)
    inventory = None
    budgets: dict[str, int] = {}
    if devices:
        from planner.hardware.budgets import resolve_budgets
        from planner.hardware.inventory import load_inventory

        inventory = load_inventory(devices)
        b = resolve_budgets(inventory, max_vram)
        budgets = {**b.devices, HOST: b.host_bytes}
    elif max_vram:
        raise BadInput("--max-vram needs --devices (budgets are relative to an inventory)")
    return ValidateRequest(target, parse_llama_flags(flags), inventory, budgets, n_prompt, n_gen)


def _check_header(path: str, doc: dict[str, Any], model: str) -> Any:
    """The plan's model, read once (validate reuses it), checked against the recorded hash."""
    from planner.gguf.reader import read_model

    want = doc["model"].get("header_sha256")
    mf = read_model(model)
    if want and mf.header_bytes and mf.header_sha256 != want:
        raise BadInput(f"{path}: {model} is not the model the plan was made for (header sha256 differs)")
    return mf

