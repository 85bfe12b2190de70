"""`fitplan serve PLAN.yaml [-- extra llama-server flags]`: run a plan's llama-server on this
machine and check what it allocates against the plan.

- `prepare_serve(req)`: the plan read back, the extra flags merged the way llama.cpp reads them
  (a later value wins, `-ot`/`--rpc` append), re-estimated and refused when the plan no longer
  fits its budgets, the hardware compared with the plan's (refused unless `force`), and the
  argument vector llama-server gets (`-np` stated: llama-server's default is 4 slots).
- `run_serve(prepared, on_ready)`: start it, wait for /health, compare the buffers llama.cpp logged
  while loading with the estimate, hand the caller the URL, forward SIGINT/SIGTERM to the server's
  pid until it stops, then compare llama.cpp's own memory breakdown (printed as it stops).
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

from planner.checking.validate import load_plan, target_rows
from planner.checking.validation_report import DeviceReport, ValidateRequest, judge, with_budgets
from planner.core.errors import BadInput, InfeasiblePlacement, Shortfall
from planner.core.render import table
from planner.core.units import MiB, fmt_mib
from planner.hardware.budgets import DEFAULT_DEVICE_MARGIN, pool_name, resolve_budgets
from planner.hardware.detect import detect_inventory
from planner.hardware.inventory import Inventory, rpc_endpoints
from planner.llama.commands import LLAMA_SERVER, server_argv
from planner.llama.context import model_context
from planner.llama.flags import FLAGS, LlamaFlags, arg, flags_to_argv, parse_llama_flags
from planner.llama.placement import HOST, HOST_ROWS
from planner.llama.programs import Program
from planner.llama.settings import resolve_settings
from planner.measuring.device_memory import PlannedDevice, after_load_notes, measure_gpus, planned_devices
from planner.memory.estimate import Estimate, estimate_settings
from planner.running.tool_runs import (
    host_row,
    parse_breakdown,
    parse_buffers,
    parse_clip_log,
    parse_lora_buffers,
    parse_model_loads,
    rows_by_device,
    start_server,
    wait_ready,
)
from planner.system.llama_tools import LOOPBACK, free_port, stop_process

log = logging.getLogger(__name__)

DEFAULT_PORT = 8080   # llama-server's own default (common/common.h)
# The estimate's tolerance (README "Estimate accuracy"): model and context within 1 MiB (the
# breakdown prints floor(bytes / MiB)), compute within 3 % or 4 MiB.
MODEL_SLACK = MiB
COMPUTE_REL = 0.03
COMPUTE_ABS = 4 * MiB
# a device's growth after load beyond its rows and overhead that serve warns about: the H200 record's loads grew
# within 2 MiB of them (tests/peer/test_gpu_overhead.py); the pool grows on use beyond one answer
DEVICE_SLACK = 64 * MiB
# llama-server's trace level: the load's buffer lines and the breakdown it prints as it stops
# (common/log.h LOG_LEVEL_TRACE; the default level 3 shows neither)
LOG_LEVEL = arg("verbosity", 4)
# llama-server options that change nothing in memory and are not llama.cpp common flags fitplan
# parses (tools/server options of common/arg.cpp): passed through as written, each with its value.
SERVER_VALUED = frozenset(["--api-key", "--api-key-file", "--ssl-key-file", "--ssl-cert-file", "--path", "--api-prefix",
                           "--slot-save-path", "--media-path", "--chat-template-file", "--chat-template-kwargs",
                           "--slot-prompt-similarity", "-sps"])
# serve's own (where it listens), and the plan's model
SERVE_OWNS = frozenset(name for key in ("host", "port", "model", "model_url") for name in FLAGS[key].names)


@dataclass(frozen=True)
class ServeRequest:
    plan_path: str
    extra: tuple[str, ...] = ()
    host: str = LOOPBACK
    port: int = DEFAULT_PORT     # 0: a free port
    bin_dir: Path | None = None  # None: llama-server as the program name (a dry run) or the pinned build
    force: bool = False          # run a plan made for other hardware
    check_hardware: bool = True
    here: Inventory | None = None              # this machine as described (None: detected)
    max_vram: str | None = None                # budgets in place of the plan's, against `here` or the
    max_ram: str | None = None                 # plan's inventory (as fitplan plan reads them)


@dataclass(frozen=True)
class PreparedServe:
    argv: tuple[str, ...]
    url: str
    host: str
    port: int
    flags: LlamaFlags
    predicted: dict[str, tuple[int, int, int]]   # row -> (model, context, compute), as llama-server reserves
                                                 # for the target (its memory breakdown covers the target only)
    budgets: dict[str, int]
    names: tuple[str, ...]                       # the plan's devices in llama.cpp's order
    endpoints: dict[str, str] = field(default_factory=dict)   # RPC device -> endpoint
    notes: tuple[str, ...] = ()
    uma_pool_bytes: int | None = None            # what Host and `pool_devices` hold together
    pool_devices: tuple[str, ...] = ()
    load_predicted: dict[str, tuple[int, int, int]] | None = None   # every model at load (companions added);
                                                                    # None: the target's alone
    gpus: tuple[PlannedDevice, ...] = ()   # local CUDA/ROCm devices, measured before and after the load


@dataclass(frozen=True)
class MemoryCheck:
    """One comparison of what llama.cpp allocated with the plan."""

    stage: str                 # "load": the buffer sizes it logged; "shutdown": its memory breakdown
    devices: tuple[DeviceReport, ...]
    verdict: str
    fits: bool
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "verdict": self.verdict, "fits": self.fits, "notes": list(self.notes),
                "devices": [{"name": d.name, "model_bytes": d.weights_bytes, "context_bytes": d.kv_bytes,
                             "compute_bytes": d.compute_bytes, "budget_bytes": d.budget_bytes,
                             "predicted": None if d.predicted is None else
                             dict(zip(("model_bytes", "context_bytes", "compute_bytes"), d.predicted, strict=True))}
                            for d in self.devices]}

    def to_table(self) -> str:
        def pred(d: DeviceReport, i: int) -> str:
            return "-" if d.predicted is None else fmt_mib(d.predicted[i])

        rows = [[d.name, fmt_mib(d.weights_bytes), pred(d, 0), fmt_mib(d.kv_bytes), pred(d, 1),
                 fmt_mib(d.compute_bytes), pred(d, 2), "-" if d.budget_bytes is None else fmt_mib(d.budget_bytes)]
                for d in self.devices]
        source = "buffers logged while loading" if self.stage == "load" else "llama.cpp's memory breakdown at exit"
        lines = [f"{self.stage}: {source}",
                 table(["device", "model MiB", "(pred)", "context MiB", "(pred)", "compute MiB", "(pred)",
                        "budget MiB"], rows, align="lrrrrrrr")]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines + [f"verdict ({self.stage}): {self.verdict}"]) + "\n"


@dataclass(frozen=True)
class ServeResult:
    pid: int
    returncode: int
    log_path: str
    load: MemoryCheck | None        # None: stopped before it was ready
    shutdown: MemoryCheck | None    # None: no breakdown table in the log (killed, or crashed)

    @property
    def fits(self) -> bool:
        return all(c.fits for c in (self.load, self.shutdown) if c is not None)


# --- preparing ----------------------------------------------------------------------------------

def _split_extra(extra: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(llama.cpp flags fitplan parses, llama-server-only options passed through)."""
    llama, server = [], []
    i = 0
    while i < len(extra):
        name = extra[i].partition("=")[0] if extra[i].startswith("--") else extra[i]
        if name in SERVE_OWNS:
            raise BadInput(f"{name}: serve chooses it (use serve's --host/--port; the model is the plan's)")
        if name in SERVER_VALUED:
            take = 1 if "=" in extra[i] else 2
            server += list(extra[i:i + take])
            i += take
            continue
        llama.append(extra[i])
        i += 1
    return llama, server


def _memory_fields(flags: LlamaFlags) -> LlamaFlags:
    return replace(flags, ignored=())


def _no_longer_fits(predicted: dict[str, tuple[int, int, int]], req: ValidateRequest, extra: list[str]
                    ) -> InfeasiblePlacement | None:
    """The error when `predicted` overruns the request's budgets (each row's, and the pool Host
    shares with UMA devices, charged to Host as Budgets.over charges it); None when it fits."""
    limits = req.limits
    totals = {row: sum(fig) for row, fig in predicted.items() if row in req.budgets}
    if not limits.over(totals):
        return None
    short = [Shortfall(row, n, req.budgets[row]) for row, n in totals.items() if n > req.budgets[row]]
    pool = None
    if limits.pool_excess(totals) and limits.uma_pool_bytes is not None:
        pool = Shortfall(HOST, limits.pooled(totals), limits.uma_pool_bytes)   # the pool is Host's budget too
        short.append(pool)
    worst = max(short, key=lambda s: s.missing_bytes)
    if worst is pool:
        why = (f"{pool_name(limits)} need {fmt_mib(pool.need_bytes)} MiB together, the pool they share is "
               f"{fmt_mib(pool.budget_bytes)} MiB")
    else:
        why = f"{worst.device} needs {fmt_mib(worst.need_bytes)} MiB, its budget is {fmt_mib(worst.budget_bytes)} MiB"
    return InfeasiblePlacement(f"with {' '.join(extra) or 'these budgets'} the plan no longer fits: {why}",
                               tuple(short))


def hardware_difference(planned: Inventory | None, here: Inventory, flags: LlamaFlags,
                        need: dict[str, tuple[int, int, int]]) -> list[str]:
    """What differs between the plan's devices and this machine's, in words ([] when it can run here):
    devices missing (or extra when the plan has no -dev to leave them out) and free memory short of
    what the plan allocates on a device or on the host."""
    if planned is None:
        return []
    out = []
    missing = [n for n in planned.names if here.get(n) is None]
    extra = [n for n in here.names if planned.get(n) is None]
    if missing or (extra and flags.devices is None):
        out.append(f"the plan is for {', '.join(planned.names) or 'the CPU only'}; this machine has "
                   f"{', '.join(here.names) or 'no GPU or RPC device'}")
    for name in planned.names:
        dev = here.get(name)
        if dev is not None and name in need and dev.free_bytes < sum(need[name]):
            out.append(f"{name} has {fmt_mib(dev.free_bytes)} MiB free, the plan allocates "
                       f"{fmt_mib(sum(need[name]))} MiB")
    if HOST in need and here.host.ram_available_bytes < sum(need[HOST]):
        out.append(f"the host has {fmt_mib(here.host.ram_available_bytes)} MiB available, the plan allocates "
                   f"{fmt_mib(sum(need[HOST]))} MiB")
    return out


def _budgets(req: ServeRequest, plan: ValidateRequest) -> ValidateRequest:
    """The plan judged against --max-vram/--max-ram (this machine as described, else the plan's
    devices), its shared pool included; the plan as it is without them."""
    inventory = req.here or plan.inventory
    if not (req.max_vram or req.max_ram):
        return plan
    if inventory is None:
        raise BadInput("--max-vram/--max-ram: the plan has no inventory; expected --devices, --device or --rpc too")
    return with_budgets(plan, resolve_budgets(inventory, req.max_vram, req.max_ram),
                        host=bool(inventory.host.ram_available_bytes))


def prepare_serve(req: ServeRequest) -> PreparedServe:
    """The command serve runs and what it will be checked against; raises InfeasiblePlacement when
    the extra flags make the plan overrun a budget, BadInput when this machine is not the plan's."""
    plan = load_plan(req.plan_path)
    llama_extra, server_extra = _split_extra(req.extra)
    flags = parse_llama_flags(flags_to_argv(plan.flags) + llama_extra)
    assert plan.model_file is not None
    ctx = model_context(plan.model_file)
    settings = resolve_settings(ctx, flags, plan.inventory)
    est = estimate_settings(settings, program=Program.SERVER)
    notes = []
    judged = _budgets(req, plan)
    if _memory_fields(flags) != _memory_fields(plan.flags) or judged is not plan:
        notes.append(f"re-estimated with {' '.join(llama_extra)}")
        error = _no_longer_fits(with_companions(target_rows(est), est), judged, llama_extra)
        if error is not None:
            raise error
    predicted = target_rows(est)
    if req.check_hardware and not req.force and plan.inventory is not None:
        _check_same_hardware(req, plan.inventory, flags, predicted)
    port = req.port or free_port()
    program = str(req.bin_dir / LLAMA_SERVER) if req.bin_dir else LLAMA_SERVER
    argv = [program, *server_argv(plan.model, flags_to_argv(flags), flags.n_parallel), *server_extra,
            *arg("host", req.host), *arg("port", port), *LOG_LEVEL]
    names = tuple(d.name for d in settings.devices)
    endpoints, bus_ids = _endpoints_and_bus_ids(plan.inventory)
    load_predicted = with_companions(predicted, est) if est.companions else None
    gpus = planned_devices(names, {d.name: d.backend for d in settings.devices}, load_predicted or predicted,
                           {name: o.bytes for name, o in est.overheads}, bus_ids)
    return PreparedServe(tuple(argv), f"http://{req.host}:{port}", req.host, port, flags, predicted,
                         judged.budgets, names, endpoints, tuple(notes), judged.uma_pool_bytes, judged.pool_devices,
                         load_predicted, tuple(gpus))


def _check_same_hardware(req: ServeRequest, planned: Inventory, flags: LlamaFlags,
                         predicted: dict[str, tuple[int, int, int]]) -> None:
    """BadInput when this machine (req.here, else detected) differs from the one the plan was made for."""
    here = req.here or detect_inventory(rpc_endpoints(planned))
    diff = hardware_difference(planned, here, flags, predicted)
    if diff:
        raise BadInput(f"{req.plan_path} was made for other hardware: {'; '.join(diff)} (--force runs it anyway)")


def _endpoints_and_bus_ids(inventory: Inventory | None) -> tuple[dict[str, str], dict[str, str]]:
    """The plan's rpc-servers (device name -> endpoint) and PCI bus ids (device name -> id), where known."""
    devices = inventory.devices if inventory else ()
    specs = {d.name: d for d in devices}
    return ({d.name: d.endpoint for d in devices if d.endpoint},
            {n: d.id for n, d in specs.items() if d.id})


def with_companions(target: dict[str, tuple[int, int, int]], est: Estimate) -> dict[str, tuple[int, int, int]]:
    """The target's rows with every companion's added (host rows folded into Host, as the target's)."""
    out = dict(target)
    for c in est.companions:
        for d in c.devices:
            row = HOST if d.name in HOST_ROWS else d.name
            m, k, x = out.get(row, (0, 0, 0))
            out[row] = (m + d.model_bytes, k + d.context_bytes, x + d.compute_bytes)
    return out


def with_program(prepared: PreparedServe, bin_dir: Path) -> PreparedServe:
    """The same command with llama-server from `bin_dir`."""
    return replace(prepared, argv=(str(bin_dir / LLAMA_SERVER), *prepared.argv[1:]))


# --- running ------------------------------------------------------------------------------------

def _check(stage: str, rows: dict[str, tuple[int, int, int]], prepared: PreparedServe, notes: tuple[str, ...] = ()
           ) -> MemoryCheck:
    predicted = prepared.predicted if stage != "load" or prepared.load_predicted is None else prepared.load_predicted
    devices = tuple(DeviceReport(row, *rows.get(row, (0, 0, 0)), predicted.get(row),
                                 prepared.budgets.get(row), 0.0)
                    for row in [*prepared.names, HOST])
    verdict = judge(devices, slack=MODEL_SLACK, compute_rel=COMPUTE_REL, compute_abs=COMPUTE_ABS,
                    uma_pool_bytes=prepared.uma_pool_bytes, pool_devices=prepared.pool_devices)
    return MemoryCheck(stage, devices, verdict.text, verdict.fits, notes + verdict.notes)


def load_rows(text: str, endpoints: dict[str, str], companions: bool = False) -> dict[str, tuple[int, int, int]]:
    """Rows from the buffer lines of a load (llama.cpp names buffers, not devices); with companions,
    every model's: the target and a drafter (one load each), adapters, the projector."""
    by_kind = rows_by_device(every_model_buffers(text) if companions else parse_buffers(text), endpoints)
    return {row: (k.get("model", 0), k.get("context", 0), k.get("compute", 0)) for row, k in by_kind.items()}


def every_model_buffers(text: str) -> dict[tuple[str, str], int]:
    """(buffer type, kind) -> bytes over every model a llama-server log loads (run with -fit off:
    each load is a real one)."""
    out: dict[tuple[str, str], int] = {}

    def add(key: tuple[str, str], size: int) -> None:
        out[key] = out.get(key, 0) + size

    for load in parse_model_loads(text):
        for key, size in load.items():
            add(key, size)
    for buffers in (parse_lora_buffers(text).values() if "LoRA buffer size" in text else ()):
        for buft, size in buffers.items():
            add((buft, "model"), size)
    clip = parse_clip_log(text)
    for key, size in (clip.buffers.items() if clip else ()):
        add(key, size)
    return out


def shutdown_rows(text: str) -> dict[str, tuple[int, int, int]]:
    """Rows of llama.cpp's memory breakdown, host buffer types folded into Host as the estimate does."""
    rows: dict[str, tuple[int, int, int]] = {}
    for name, fig in parse_breakdown(text).items():
        row = host_row(name)
        old = rows.get(row, (0, 0, 0))
        rows[row] = (old[0] + fig[0], old[1] + fig[1], old[2] + fig[2])
    return rows


@contextlib.contextmanager
def forward_signals(proc: subprocess.Popen) -> Iterator[list[int]]:
    """While the body runs, SIGINT and SIGTERM sent to this process go to the server's pid instead
    (it stops cleanly and prints its breakdown); yields the signals received."""
    received: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def run_serve(prepared: PreparedServe, on_ready: Callable[[int, MemoryCheck], None],
              log_path: Path | None = None) -> ServeResult:
    """Run llama-server until it stops (a forwarded signal, or on its own); `on_ready(pid, check)`
    is called once /health answers, with the load's comparison."""
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="fitplan-serve-", suffix=".log")
        os.close(fd)   # kept after the run: the log is the user's
        log_path = Path(name)
    before = measure_gpus() if prepared.gpus else []
    proc = start_server(list(prepared.argv), log_path)
    load = None
    try:
        with forward_signals(proc) as received:
            try:
                host = LOOPBACK if prepared.host in ("0.0.0.0", "::") else prepared.host
                wait_ready(proc, prepared.port, log_path, host)
            except Exception:
                if not received:
                    raise
            else:
                load = _check("load", load_rows(log_path.read_text(errors="replace"), prepared.endpoints,
                                                prepared.load_predicted is not None), prepared, prepared.notes)
                if prepared.gpus:   # the device as its driver sees it: the rows, the overhead, what is left
                    measured = after_load_notes(list(prepared.gpus), before, measure_gpus(), DEFAULT_DEVICE_MARGIN,
                                                DEVICE_SLACK)
                    load = replace(load, notes=load.notes + tuple(measured))
                on_ready(proc.pid, load)
            proc.wait()
    finally:
        stop_process(proc)
    text = log_path.read_text(errors="replace")
    rows = shutdown_rows(text)
    shutdown = _check("shutdown", rows, prepared) if rows and load is not None else None
    return ServeResult(proc.pid, proc.returncode, str(log_path), load, shutdown)
