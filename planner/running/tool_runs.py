"""The llama.cpp side of `fitplan validate --engine llama.cpp`: run the real tools on loopback
and read what they report.

- `llama_server(...)`: a llama-server bound to 127.0.0.1 on a free port for token-id prompts
  (/completion with n_probs, temperature 0); stopped by its own process, never by name.
- `parse_log(text)`: the figures llama.cpp logs at load (`load_tensors: X model buffer size`,
  `llama_kv_cache: X KV buffer size`, `llama_memory_recurrent: X RS buffer size` (context too),
  `sched_reserve: X compute buffer size`, and
  `graph: nodes = N, splits = S` or `graph (pp bs=.., tg bs=..): nodes = a / b, splits = c / d`).
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
import shlex
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from gguf import Keys

from planner.checking.validation_report import DeviceReport, ValidateReport, ValidateRequest, judge, prompt_ids
from planner.core.units import MiB
from planner.llama.context import ModelContext
from planner.llama.flags import LlamaFlags, OverrideArg, OverrideKind, arg, flags_to_argv
from planner.llama.placement import HOST, resolve_devices
from planner.system.llama_tools import LOOPBACK, ToolsError, free_port, rpc_servers, stop_process, tools_dir

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
LOG_ROUNDING = MiB // 200   # llama.cpp prints buffer sizes in MiB with two decimals
REQUEST_TIMEOUT_S = 300.0

# the recurrent state of a hybrid or recurrent model (llama_memory_recurrent's RS buffers) is context, as in
# llama.cpp's memory breakdown
_BUFFER = re.compile(r"(load_tensors|llama_kv_cache|llama_memory_recurrent|sched_reserve):\s+(\S+) "
                     r"(model|KV|RS|compute) buffer size =\s+([\d.]+) MiB")
_GRAPH = re.compile(r"graph(?: \(pp bs=\d+, tg bs=\d+\))?: nodes = (\d+)(?: / (\d+))?, splits = (\d+)(?: / (\d+))?")
_KIND = {"model": "model", "KV": "context", "RS": "context", "compute": "compute"}


@dataclass(frozen=True)
class LlamaLog:
    """What one llama.cpp load logged: buffers per (buffer type, kind) in bytes (from MiB with
    two decimals, so within 5 KiB), nodes and splits of the prompt and the one-token graph."""

    buffers: dict[tuple[str, str], int] = field(default_factory=dict)
    n_nodes_pp: int = 0
    n_nodes_tg: int = 0
    n_splits_pp: int = 0
    n_splits_tg: int = 0


def parse_log(text: str) -> LlamaLog:
    """The last load in the text wins (llama-cli, llama-server and llama-fit-params log a dry run
    first: its buffers are the ones logged before the last graph line but one)."""
    graphs = _GRAPH.findall(text)
    if not graphs:
        raise ToolsError("llama.cpp logged no 'graph: nodes = ..., splits = ...' line (was -v given?)")
    nodes_pp, nodes_tg, splits_pp, splits_tg = graphs[-1]
    return LlamaLog(parse_buffers(text), int(nodes_pp), int(nodes_tg or nodes_pp), int(splits_pp),
                    int(splits_tg or splits_pp))


def parse_buffers(text: str) -> dict[tuple[str, str], int]:
    """The buffers of the last load in a log, (buffer type, kind) -> bytes; a log without graph
    lines (a load that has not reserved yet) is read whole. A load reserved again (applied LoRA
    adapters: the warmup's sched_reserve) keeps its model and KV buffers and the last reserve's compute."""
    return _settled(_last_load(text))


def _buffers_in(text: str) -> dict[tuple[str, str], int]:
    buffers: dict[tuple[str, str], int] = {}
    for _stage, buft, kind, mib in _BUFFER.findall(text):
        key = (buft, _KIND[kind])
        buffers[key] = buffers.get(key, 0) + round(float(mib) * MiB)   # SWA and base caches: two KV lines
    return buffers


# llama_model_load (src/llama-model-loader.cpp) opens every model it loads with this line: the target,
# then a drafter (common_speculative_init_result), each with its own buffers after it
_MODEL_LOAD = re.compile(r"llama_model_loader: loaded meta data with")
# common/speculative.cpp common_speculative_init_result, before it makes draft-mtp's context
MTP_CONTEXT_LINE = "creating MTP draft context against the target model"


def parse_model_loads(text: str) -> list[dict[tuple[str, str], int]]:
    """The buffers of each model load in a log, in load order: (buffer type, kind) -> bytes, as
    parse_buffers reads one load. llama-server loads the target and then a drafter (-md), so with
    `-fit off` (no dry runs: with -fit on each fitting pass is a load too) [0] is the target's and [1]
    the drafter's, or (--spec-type draft-mtp without -md) the MTP context's on the target's model."""
    starts = [m.start() for m in _MODEL_LOAD.finditer(text)]
    if not starts:
        return [parse_buffers(text)]
    loads = []
    for a, b in zip(starts, starts[1:] + [len(text)], strict=True):
        # mtp: draft-mtp's context is made on the target's model, so no model load opens it: its own
        # cache and reserves follow this line (common/speculative.cpp common_speculative_init_result)
        target, mark, mtp = text[a:b].partition(MTP_CONTEXT_LINE)
        loads += [_settled(target)] + ([_settled(mtp)] if mark else [])
    return loads


def _reserves(text: str) -> list[int]:
    """Where each reserve's text starts: the text up to and including a graph line is one reserve."""
    return [0] + [m.end() for m in _GRAPH.finditer(text)][:-1]


def _reserve_again(text: str) -> bool:
    """A reserve that allocates nothing but compute buffers: llama_context::sched_reserve run again
    for the same context (set_adapters_lora marks it, the warmup decode runs it: llama-context.cpp,
    common/common.cpp common_init_from_params). No model is loaded and no cache made in it."""
    if _MODEL_LOAD.search(text):
        return False
    kinds = {kind for _stage, _buft, kind, _mib in _BUFFER.findall(text)}
    return kinds == {"compute"}


def _settled(text: str) -> dict[tuple[str, str], int]:
    """The buffers of one load: every line, except that when the load was reserved again, the
    compute buffers are the last reserve's (sched_reserve builds a new scheduler and buffers)."""
    starts = _reserves(text)
    if len(starts) < 2 or not _reserve_again(text[starts[-1]:]):
        return _buffers_in(text)
    kept = {k: v for k, v in _buffers_in(text[:starts[-1]]).items() if k[1] != "compute"}
    return kept | _buffers_in(text[starts[-1]:])


# common/fit.cpp common_memory_breakdown_print, logged at trace level (-lv 4) by llama-server as it
# stops (tools/server/server.cpp): `| - NAME (DESC) | total = free + (self = model + context +
# compute) + unaccounted |` per device, `| - Host | self = model + context + compute |`, and the
# same for every other buffer type on a row of its own. Figures are floor(bytes / MiB).
_BREAKDOWN_DEVICE = re.compile(r"common_memory_breakdown_print: \|\s+- (\S+) \(.*\)\s+\|\s*(\d+) = +(\d+) \+ \(\s*"
                               r"(\d+) = +(\d+) \+ +(\d+) \+ +(\d+)\) \+ +(-?\d+)")
_BREAKDOWN_OTHER = re.compile(r"common_memory_breakdown_print: \|\s+- (\S+)\s+\|\s+(\d+) = +(\d+) \+ +(\d+) \+ +(\d+)"
                              r"\s+\|")
_DEVICE_COLUMNS = ("total", "free", "self", "model", "context", "compute", "unaccounted")
_OTHER_COLUMNS = ("self", "model", "context", "compute")


def breakdown_table(text: str) -> dict[str, dict[str, int]]:
    """The last memory breakdown table in a log, every column as printed (MiB, rounded down):
    devices `total, free, self, model, context, compute, unaccounted`, other rows (Host, extra host
    buffer types) `self, model, context, compute`; {} when it printed none."""
    header = text.rfind("memory breakdown [MiB]")
    if header < 0:
        return {}
    table_text = text[header:]
    rows = {m[0]: dict(zip(_DEVICE_COLUMNS, map(int, m[1:]), strict=True))
            for m in _BREAKDOWN_DEVICE.findall(table_text)}
    for m in _BREAKDOWN_OTHER.findall(table_text):
        rows[m[0]] = dict(zip(_OTHER_COLUMNS, map(int, m[1:]), strict=True))
    return rows


def parse_breakdown(text: str) -> dict[str, tuple[int, int, int]]:
    """The last memory breakdown table in a log: row name -> (model, context, compute) bytes, as
    llama.cpp printed them (MiB, rounded down); {} when it printed none."""
    return {name: (row["model"] * MiB, row["context"] * MiB, row["compute"] * MiB)
            for name, row in breakdown_table(text).items()}


def fit_print(bin_dir: Path, model: Path, argv: list[str],
              env: dict[str, str] | None = None) -> dict[str, tuple[int, int, int]]:
    """`llama-fit-params -m MODEL --fit-print on ARGV`'s rows: device -> (model, context, compute) MiB,
    as it prints them (common/fit.cpp common_fit_print: one `NAME MODEL CONTEXT COMPUTE` line per device and
    host row); a failed run raises ToolsError with the end of its stderr. `env` replaces the environment
    (a Vulkan build's GGML_VK_VISIBLE_DEVICES)."""
    done = subprocess.run([str(bin_dir / "llama-fit-params"), *arg("model", model), *arg("fit_print", "on"), *argv],
                          capture_output=True, text=True, timeout=300, check=False, env=env)
    if done.returncode != 0:
        raise ToolsError(f"llama-fit-params {' '.join(argv)} failed: {done.stderr.strip()[-500:]}")
    rows = {}
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
            rows[parts[0]] = (int(parts[1]), int(parts[2]), int(parts[3]))
    return rows


# src/llama-adapter.cpp: llama_adapter_lora_init logs "loading lora adapter from 'PATH' ...", then
# llama_adapter_lora_init_impl one "<buffer> LoRA buffer size = X MiB" line per buffer type.
_LORA_START = re.compile(r"llama_adapter_lora_init: loading lora adapter from '(.*)' \.\.\.")
_LORA_BUFFER = re.compile(r"llama_adapter_lora_init_impl:\s+(\S+) LoRA buffer size =\s+([\d.]+) MiB")


def parse_lora_buffers(text: str) -> dict[str, dict[str, int]]:
    """Each adapter's buffers in a log, path as logged -> buffer name -> bytes (from MiB with two
    decimals, so within 5 KiB); an adapter loaded twice keeps its last load's."""
    out: dict[str, dict[str, int]] = {}
    starts = list(_LORA_START.finditer(text))
    for m, nxt in zip(starts, [*starts[1:], None], strict=True):
        chunk = text[m.end():nxt.start() if nxt else len(text)]
        out[m.group(1)] = {buft: round(float(mib) * MiB) for buft, mib in _LORA_BUFFER.findall(chunk)}
    return out


@dataclass(frozen=True)
class TokenProbs:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class ServerClient:
    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(f"http://{LOOPBACK}:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
            return json.loads(resp.read())

    def greedy(self, prompt: list[int], n_predict: int, n_probs: int = 2) -> list[TokenProbs]:
        """llama.cpp's greedy continuation of token ids, with the top-n logprobs at each step."""
        doc = self.post("/completion", {"prompt": prompt, "n_predict": n_predict, "n_probs": n_probs,
                                        "temperature": 0, "cache_prompt": False, "ignore_eos": True})
        return [TokenProbs(int(p["id"]), float(p["logprob"]),
                           tuple((int(t["id"]), float(t["logprob"])) for t in p["top_logprobs"]))
                for p in doc["completion_probabilities"]]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


# llama-server stops filling a prompt batch this many tokens before the prompt's end, so that it
# can checkpoint the memory that cannot be rolled back (sliding-window caches, recurrent state):
# server-context.cpp, checkpoint_offsets {4 + n_ubatch, 4} (llama.cpp PR 20288).
CHECKPOINT_TAIL = 4


def server_prompt_batches(n_tokens: int, checkpoints: bool, n_batch: int = 2048, n_ubatch: int = 512) -> list[int]:
    """Sizes of the batches llama-server decodes a fresh n-token prompt in. With checkpoints (a
    model with a sliding window or recurrent layers) the batch breaks when 4 + n_ubatch and when 4
    tokens remain; every batch holds at most n_batch tokens."""
    cuts = {n_tokens}
    if checkpoints:
        cuts |= {n_tokens - min(n_batch, off) for off in (CHECKPOINT_TAIL + n_ubatch, CHECKPOINT_TAIL)}
    sizes, start = [], 0
    for cut in sorted(c for c in cuts if 0 < c <= n_tokens):
        while start < cut:
            step = min(n_batch, cut - start)
            sizes.append(step)
            start += step
    return sizes


def server_ready(port: int, host: str = LOOPBACK) -> bool:
    """llama-server answers /health with 200 (it answers 503 while the model loads)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_server(argv: list[str], log_path: Path) -> subprocess.Popen:
    """Start a llama-server `argv` with its output in `log_path`, in a session of its own (so a
    terminal's Ctrl-C reaches the caller, which decides what the server gets)."""
    with open(log_path, "w") as out:   # the server keeps its own copy of the fd
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def wait_ready(proc: subprocess.Popen, port: int, log_path: Path, host: str = LOOPBACK,
               timeout_s: float = START_TIMEOUT_S) -> None:
    """Until /health answers; a server that exits or takes longer than `timeout_s` is an error
    carrying the end of its log."""
    deadline = time.monotonic() + timeout_s
    while not server_ready(port, host):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace")[-1500:]
            how = f"exited with {proc.returncode}" if proc.poll() is not None else f"not ready in {timeout_s:.0f} s"
            raise ToolsError(f"llama-server did not start ({how}): {tail}")
        time.sleep(0.2)


@contextlib.contextmanager
def llama_server(bin_dir: Path, model: str, flags: list[str]) -> Iterator[ServerClient]:
    """A llama-server on 127.0.0.1 with `flags` (one slot, verbose log); stopped on exit."""
    with tempfile.TemporaryDirectory(prefix="fitplan-server-") as tmp:
        port = free_port()
        log_path = Path(tmp) / "server.log"
        argv = [str(bin_dir / "llama-server"), *arg("model", model), *arg("host", LOOPBACK), *arg("port", port),
                *arg("n_parallel", 1), *arg("verbose"), *flags]
        proc = start_server(argv, log_path)
        try:
            wait_ready(proc, port, log_path)
            yield ServerClient(port, log_path)
        finally:
            stop_process(proc)


# --- validate --engine llama.cpp ------------------------------------------------------------------

_HOST_BUFTS = ("CPU", "CPU_Mapped", "CPU_REPACK")


def _rpc_flags(flags: LlamaFlags, names: list[str], endpoints: list[str]) -> LlamaFlags:
    """The same placement on loopback rpc-servers: device i becomes RPCi at endpoints[i];
    -ot targets naming a device are renamed to its rpc buffer type (ggml-rpc: RPC0[host:port])."""
    by_name = {n: f"RPC0[{ep}]" for n, ep in zip(names, endpoints, strict=True)}
    old_rpc = {f"RPC0[{ep}]": f"RPC0[{new}]" for ep, new in zip(flags.rpc, endpoints, strict=False)}
    args = []
    for o in flags.override_args:
        if o.kind is not OverrideKind.OT:
            args.append(o)
            continue
        items = []
        for item in o.value.split(","):
            pattern, _, target = item.partition("=")
            items.append(f"{pattern}={by_name.get(target, old_rpc.get(target, target))}")
        args.append(OverrideArg(OverrideKind.OT, ",".join(items)))
    return replace(flags, rpc=tuple(endpoints), devices=None, override_args=tuple(args))


def host_row(buft: str) -> str:
    """The row a llama.cpp buffer type or breakdown row counts in: Host for the host's buffer types."""
    return HOST if buft in _HOST_BUFTS or buft.endswith("_Host") else buft


def rows_by_device(buffers: dict[tuple[str, str], int], endpoint_of: dict[str, str]) -> dict[str, dict[str, int]]:
    """Bytes per device row (device name or Host) and kind, from llama.cpp's buffer type names."""
    device_of = {f"RPC0[{ep}]": name for name, ep in endpoint_of.items()}
    rows: dict[str, dict[str, int]] = {}
    for (buft, kind), size in buffers.items():
        row = host_row(buft)
        row = device_of.get(row, row)
        rows.setdefault(row, {}).setdefault(kind, 0)
        rows[row][kind] += size
    return rows


def _last_load(text: str) -> str:
    """llama.cpp logs a dry run before the real load: keep what follows the last graph line but one,
    or, when the last reserves were reserves again of one load (applied LoRA adapters), from that
    load's first reserve on."""
    starts = _reserves(text)
    bounds = list(zip(starts, [*starts[1:], len(text)], strict=True))
    i = len(bounds) - 1
    while i > 0 and _reserve_again(text[bounds[i][0]:bounds[i][1]]):
        i -= 1
    return text[starts[i]:]


def validate_llama(req: ValidateRequest, ctx: ModelContext,
                   predicted: dict[str, tuple[int, int, int]]) -> ValidateReport:
    """Run llama-server with the request's placement (rpc-servers stand in for the devices)."""
    if req.flags.n_parallel != 1:
        raise ToolsError("validate runs one sequence: drop -np")
    bin_dir = tools_dir()
    if bin_dir is None:   # a CLI check does not start a 15-minute build: say how to get the tools
        raise ToolsError("--engine llama.cpp needs the llama.cpp tools: build them with scripts/build_llama_cpp.sh")
    names = [d.name for d in resolve_devices(req.flags, req.inventory)]
    with rpc_servers(len(names), bin_dir) as endpoints:
        flags = _rpc_flags(req.flags, names, endpoints)
        argv = flags_to_argv(flags) + arg("fit", "off")
        with llama_server(bin_dir, ctx.model.path, argv) as server:
            bos = ctx.model.metadata.get(Keys.Tokenizer.BOS_ID)
            prompt = prompt_ids(req.n_prompt, ctx.facts.n_vocab, bos)
            doc = server.post("/completion", {"prompt": prompt, "n_predict": req.n_gen, "temperature": 0,
                                              "cache_prompt": False, "ignore_eos": True})
            text = server.log_text()
    parsed = parse_log(text)
    rows = rows_by_device(parsed.buffers, dict(zip(names, endpoints, strict=True)))
    timings = doc.get("timings", {})
    gen_s = float(timings.get("predicted_per_second") or 0.0)
    devices = tuple(DeviceReport(row, rows.get(row, {}).get("model", 0), rows.get(row, {}).get("context", 0),
                                 rows.get(row, {}).get("compute", 0), predicted.get(row), req.budgets.get(row), 0.0)
                    for row in names + [HOST])
    verdict = judge(devices, slack=LOG_ROUNDING * 2, uma_pool_bytes=req.uma_pool_bytes,
                    pool_devices=req.pool_devices)
    notes = verdict.notes + ("llama.cpp reports no per-device time and no copied bytes",)
    per_split = (1.0 / gen_s / parsed.n_splits_tg) if gen_s and parsed.n_splits_tg else 0.0
    return ValidateReport("llama.cpp", ctx.model.path, shlex.join(flags_to_argv(req.flags)), devices,
                          parsed.n_splits_pp, parsed.n_splits_tg, None, per_split,
                          float(timings.get("prompt_per_second") or 0.0), gen_s, verdict.text, verdict.fits, notes)


# The multimodal projector's load (tools/mtmd/clip.cpp), logged after the target's: clip_ctx names
# its backend, load_hparams sums every tensor's bytes ("model size"), reserve_compute_meta prints one
# compute line per backend whose buffer exceeds a byte and the graph, warmup the flash-attention verdict.
_CLIP_BACKEND = re.compile(r"clip_ctx: CLIP using (\S+) backend")
_CLIP_MODEL = re.compile(r"load_hparams: model size:\s+([\d.]+) MiB")
_CLIP_COMPUTE = re.compile(r"reserve_compute_meta:\s+(\S+) compute buffer size =\s+([\d.]+) MiB")
_CLIP_GRAPH = re.compile(r"reserve_compute_meta: graph splits = (\d+), nodes = (\d+)")
_CLIP_FA = re.compile(r"warmup: flash attention is (enabled|disabled)")


@dataclass(frozen=True)
class ClipLog:
    """What clip.cpp logged for the projector: `buffers` as parse_buffers' (buffer type, kind) ->
    bytes (the weights under the backend's name: its model size, unpadded), from the last reserve."""

    backend: str
    buffers: dict[tuple[str, str], int]
    n_nodes: int
    n_splits: int
    flash_attn: bool


def parse_clip_log(text: str) -> ClipLog | None:
    """The projector's figures in a llama-server log, or None when no projector was loaded. A file with
    two encoders (vision and audio) loads two clip contexts, each logging its backend, the file's model
    size and its own reserve: their compute buffers and graphs add up."""
    starts = [m.start() for m in _CLIP_BACKEND.finditer(text)]
    if not starts:
        return None
    contexts = [_clip_context(text[a:b]) for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    if not contexts or any(c is None for c in contexts):
        return None
    first = contexts[0]
    assert first is not None
    buffers = dict(first.buffers)
    for c in contexts[1:]:
        assert c is not None
        for (buft, kind), size in c.buffers.items():
            if kind == "compute":
                buffers[(buft, kind)] = buffers.get((buft, kind), 0) + size
    return ClipLog(first.backend, buffers, sum(c.n_nodes for c in contexts if c is not None),
                   sum(c.n_splits for c in contexts if c is not None), first.flash_attn)


def _clip_context(text: str) -> ClipLog | None:
    """One clip context's lines, from its "CLIP using" line to the next context's."""
    backend, model = _CLIP_BACKEND.search(text), _CLIP_MODEL.search(text)
    graphs = list(_CLIP_GRAPH.finditer(text))
    if backend is None or model is None or not graphs:
        return None
    # with -fa auto a refused flash attention reserves twice: keep the lines of the last reserve
    start = graphs[-2].end() if len(graphs) > 1 else backend.end()
    buffers = {(backend.group(1), "model"): round(float(model.group(1)) * MiB)}
    for buft, mib in _CLIP_COMPUTE.findall(text[start:graphs[-1].start()]):
        buffers[(buft, "compute")] = round(float(mib) * MiB)
    fa = _CLIP_FA.search(text)
    return ClipLog(backend.group(1), buffers, int(graphs[-1].group(2)), int(graphs[-1].group(1)),
                   fa is not None and fa.group(1) == "enabled")
