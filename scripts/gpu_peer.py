"""The GPU peer record: llama.cpp's own memory figures, measured once on a real GPU (or, as a
rehearsal, on the CPU backend), kept in tests/peer/data/<backend>/<device>.json.

    python scripts/gpu_peer.py plans [--backend cuda|cpu]   # here: fitplan makes the real-load plans
    python scripts/gpu_peer.py measure --backend cuda --bin DIR --work DIR --out FILE
                                                            # there (scripts/gpu_peer.sh measure)

Both import the package (installed, or on PYTHONPATH as gpu_peer.sh sets it); `measure` needs only
python3 with numpy, pyyaml and gguf (it imports planner.synth to write the model files and the
project's llama.cpp log readers and process helpers, never the planner's solver): the matrix is a
table here, the plans were made beforehand with `plans` and committed in scripts/gpu_peer_plans.json.
Two topologies:
- "one": the GPU alone (CUDA0), or, on the CPU backend, the host alone;
- "three": two ggml-rpc-servers on 127.0.0.1 backed by the same GPU, then the GPU itself
  (llama.cpp lists RPC devices first: RPC0, RPC1, CUDA0), so buffers are CUDA buffers and
  pipeline parallelism runs between devices; on the CPU backend: RPC0, RPC1 and the host.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES

from planner.gguf.reader import read_model
from planner.measuring.llama_bench import BenchError, Workload, bench_rows, llama_bench_argv
from planner.running.tool_runs import breakdown_table, fit_print, start_server, wait_ready
from planner.synth.gguf_factory import Q
from planner.synth.shapes_common import gemma3_270m_layout, write_shape
from planner.system.llama_tools import LOOPBACK, ToolsError, free_port, rpc_servers, stop_process

REPO = Path(__file__).resolve().parents[1]
PLANS_FILE = REPO / "scripts" / "gpu_peer_plans.json"
DATA_DIR = REPO / "tests" / "peer" / "data"
MIB = 2**20
TS3 = "{ts}"                        # -ts over the topology's GPU-class devices (RPC0, RPC1[, CUDA0])


# --- the models ----------------------------------------------------------------------------------

# Where each block type keeps its f16 scales (ggml-common.h block_q8_0 / q5_0: d first; block_q4_K:
# d, dmin first; block_q6_K: d last, after ql[128], qh[64], scales[16]).
_SCALE_OFFSETS: dict[Q, tuple[int, ...]] = {Q.Q8_0: (0,), Q.Q5_0: (0,), Q.Q4_K: (0, 2), Q.Q6_K: (208,)}


def fill_random(path: Path, seed: int = 0) -> None:
    """Random quantized blocks in place of the sparse hole: random quants with small finite scales,
    norms near 1, so that a real load copies real bytes and a decode computes finite numbers."""
    rng = np.random.default_rng(seed)
    mf = read_model(path)
    with open(path, "r+b") as f:
        for t in mf.tensors:
            f.seek(t.data_offset)
            if t.ggml_type == Q.F32:
                f.write((1.0 + 0.01 * rng.standard_normal(t.n_elements)).astype(np.float32).tobytes())
                continue
            block_size, type_size = GGML_QUANT_SIZES[t.ggml_type]
            n_blocks = t.n_bytes // type_size
            blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
            scale = np.full(n_blocks, 0.002, dtype=np.float16).view(np.uint8).reshape(n_blocks, 2)
            for off in _SCALE_OFFSETS[t.ggml_type]:
                blocks[:, off:off + 2] = scale
            f.write(blocks.tobytes())


MODELS = ("gemma3-270m", "llama-8b", "qwen3-8b", "qwen3moe-30b-a3b", "gpt-oss-20b", "deepseek2-mla")


def write_models(directory: Path, random_gemma: bool) -> dict[str, Path]:
    """Every model of the matrix, written once: the Gemma shape with random blocks (the real loads
    read it) or sparse, the others sparse (llama-fit-params never reads weights)."""
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in MODELS:
        if name == "gemma3-270m":
            path = directory / "gemma3-270m.gguf"
            if not path.exists():
                spec = gemma3_270m_layout()
                partial = directory / "gemma3-270m.partial.gguf"
                [written] = spec.write(partial)
                if random_gemma:
                    fill_random(written)
                written.rename(path)
            out[name] = path
        else:
            out[name] = write_shape(name, directory)
    return out


# --- the matrix ----------------------------------------------------------------------------------

ONE, THREE = "one", "three"
MATRIX: tuple[tuple[str, str, str], ...] = (
    # Gemma 3 270M: offload, op offload around the batch of 32, flash attention, cache types, slots
    ("gemma3-270m", ONE, "-c 4096"),
    ("gemma3-270m", ONE, "-c 32768"),
    ("gemma3-270m", ONE, "-c 4096 -ngl 9"),
    ("gemma3-270m", ONE, "-c 4096 -ngl 9 --no-op-offload"),
    ("gemma3-270m", ONE, "-c 4096 -ngl 0"),
    ("gemma3-270m", ONE, "-c 4096 -ot token_embd.weight=CPU"),
    ("gemma3-270m", ONE, "-c 4096 -ot token_embd.weight=CPU --no-op-offload"),
    ("gemma3-270m", ONE, "-c 4096 -ub 16"),
    ("gemma3-270m", ONE, "-c 4096 -ub 32"),
    ("gemma3-270m", ONE, "-c 4096 -ub 128"),
    ("gemma3-270m", ONE, "-c 4096 -ub 512 -b 2048"),
    ("gemma3-270m", ONE, "-c 4096 -ngl 9 -ub 32"),
    ("gemma3-270m", ONE, "-c 4096 -fa off"),
    ("gemma3-270m", ONE, "-c 4096 -ctk q8_0 -ctv q8_0"),
    ("gemma3-270m", ONE, "-c 4096 -np 4"),
    ("gemma3-270m", THREE, "{rpc} -c 4096 -ts {ts:1,1,1}"),
    ("gemma3-270m", THREE, "{rpc} -c 4096 -ts {ts:3,1,1}"),
    ("gemma3-270m", THREE, "{rpc} -c 4096 -ts {ts:1,1,1} -ngl 9"),
    ("gemma3-270m", THREE, "{rpc} -c 4096 -ts {ts:1,1,1} -ub 16"),
    ("gemma3-270m", THREE, "{rpc} -c 4096 -ts {ts:1,1,1} -ub 32"),
    ("gemma3-270m", THREE, "{rpc} -c 4096 -ts {ts:1,1,1} -fa off"),
    ("gemma3-270m", THREE, "{rpc} -c 4096 -ts {ts:1,1,1} -np 4"),
    ("gemma3-270m", THREE, "{rpc} -c 4096 -ts {ts:1,1,1} -ot token_embd.weight=CPU"),
    # Llama 3 8B: partial offload, the output matrix on the host, cache types
    ("llama-8b", ONE, "-c 4096"),
    ("llama-8b", ONE, "-c 8192 -ngl 16"),
    ("llama-8b", ONE, "-c 4096 -ngl 16 --no-op-offload"),
    ("llama-8b", ONE, "-c 4096 -ngl 16 -ub 16"),
    ("llama-8b", ONE, "-c 4096 -ngl 16 -ub 128"),
    ("llama-8b", ONE, "-c 4096 -ot output.weight=CPU"),
    ("llama-8b", ONE, "-c 4096 -ot output.weight=CPU --no-op-offload"),
    ("llama-8b", ONE, "-c 4096 -fa off"),
    ("llama-8b", ONE, "-c 4096 -ctk q8_0 -ctv q8_0"),
    ("llama-8b", ONE, "-c 4096 -np 4"),
    ("llama-8b", THREE, "{rpc} -c 4096 -ts {ts:1,1,1}"),
    ("llama-8b", THREE, "{rpc} -c 4096 -ts {ts:1,1,2} -ngl 20"),
    ("llama-8b", THREE, "{rpc} -c 4096 -ts {ts:1,1,1} -ctk q8_0 -ctv q8_0"),
    ("llama-8b", THREE, "{rpc} -c 4096 -ts {ts:1,1,1} -ot output.weight=CPU --no-op-offload"),
    # Qwen3 8B
    ("qwen3-8b", ONE, "-c 4096"),
    ("qwen3-8b", ONE, "-c 4096 -ngl 18 -ctk q8_0 -ctv q8_0"),
    # MoE: experts on the host, -ncmoe, -cmoe with a small ubatch
    ("qwen3moe-30b-a3b", ONE, "-c 4096"),
    ("qwen3moe-30b-a3b", ONE, "-c 4096 -ot exps=CPU"),
    ("qwen3moe-30b-a3b", ONE, "-c 4096 -ot exps=CPU --no-op-offload"),
    ("qwen3moe-30b-a3b", ONE, "-c 4096 -ncmoe 8"),
    ("qwen3moe-30b-a3b", ONE, "-c 4096 -cmoe -ub 32"),
    ("qwen3moe-30b-a3b", THREE, "{rpc} -c 4096 -ts {ts:1,1,1} -ncmoe 8"),
    ("qwen3moe-30b-a3b", THREE, "{rpc} -c 4096 -ts {ts:1,1,1} -ot exps=CPU"),
    ("gpt-oss-20b", ONE, "-c 4096"),
    ("gpt-oss-20b", ONE, "-c 4096 -ncmoe 8"),
    ("gpt-oss-20b", ONE, "-c 4096 -fa off"),
    ("gpt-oss-20b", THREE, "{rpc} -c 4096 -ts {ts:1,1,1} -ncmoe 8"),
    ("deepseek2-mla", ONE, "-c 4096"),
    ("deepseek2-mla", ONE, "-c 4096 -ot exps=CPU"),
)


def expand(template: str, endpoints: list[str], n_gpu_like: int) -> list[str]:
    """A matrix template's argv: {rpc} the servers, {ts:a,b,c} the split over the topology's devices
    (the CPU backend has no GPU device after the two RPC ones, so the last share is dropped)."""
    text = template.replace("{rpc}", "--rpc " + ",".join(endpoints))
    text = re.sub(r"\{ts:([\d.,]+)\}", lambda m: ",".join(m.group(1).split(",")[:n_gpu_like]), text)
    return shlex.split(text)


# --- inventories ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: str
    driver: str
    memory_total_mib: int
    cuda: str


def inventory(backend: str, topology: str, gpu: Gpu | None, endpoints: list[str]) -> dict:
    """The inventory YAML document (as a dict) that describes the measured devices to fitplan."""
    host = {"ram": "64GiB"}
    if backend == "cpu":
        devices = [] if topology == ONE else [
            {"name": f"RPC{i}", "endpoint": e, "memory": "16GiB"}
            for i, e in enumerate(endpoints)]
        return {"description": "the CPU backend (rehearsal)", "host": host, "devices": devices}
    assert gpu is not None
    cuda0 = {"name": "CUDA0", "backend": "CUDA", "description": gpu.name, "memory": f"{gpu.memory_total_mib}MiB",
             "compute_capability": float(gpu.compute_capability)}
    rpc = [] if topology == ONE else [
        {"name": f"RPC{i}", "endpoint": e, "memory": f"{gpu.memory_total_mib}MiB", "remote_backend": "CUDA",
         "compute_capability": float(gpu.compute_capability)} for i, e in enumerate(endpoints)]
    return {"description": f"one {gpu.name}" + ("" if topology == ONE else ", also behind two rpc-servers"),
            "host": host, "devices": rpc + [cuda0]}


# --- running llama.cpp ---------------------------------------------------------------------------

# the raw buffer lines a load logs, kept in the record as printed (parse_buffers reads their sizes)
_BUFFER_LINE = re.compile(r"(load_tensors|llama_context|llama_kv_cache|sched_reserve|llama_memory_recurrent)"
                          r":\s+(\S+)\s+(model|output|KV|compute|RS) buffer size =\s+([\d.]+) MiB")


def nvidia_smi_used_mib() -> int | None:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return int(done.stdout.split()[0])


def real_load(bin_dir: Path, model: Path, argv: list[str], log_path: Path) -> dict:
    """llama-server with the plan's flags: its buffer lines while it loads, nvidia-smi's used
    memory while it serves (after one completion), its memory breakdown when it stops (SIGTERM:
    llama-server stops as on Ctrl-C and prints the table, tools/server/server.cpp)."""
    port = free_port()
    before = nvidia_smi_used_mib()
    proc = start_server([str(bin_dir / "llama-server"), "-m", str(model), "--host", LOOPBACK, "--port", str(port),
                         "-v", *argv], log_path)
    try:
        wait_ready(proc, port, log_path)
        body = json.dumps({"prompt": [10, 11, 12, 13, 14, 15, 16, 17], "n_predict": 8}).encode()  # token ids
        req = urllib.request.Request(f"http://{LOOPBACK}:{port}/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            completed = r.status == 200
        loaded = nvidia_smi_used_mib()
    finally:
        stop_process(proc, grace_s=20)
    text = log_path.read_text(errors="replace")
    return {"ok": proc.returncode == 0 and completed, "exit_code": proc.returncode,
            "buffer_lines": [m.group(0) for m in _BUFFER_LINE.finditer(text)],
            "graph": re.findall(r"graph: nodes = \d+, splits = \d+", text)[-1:],
            "breakdown": breakdown_table(text),
            "nvidia_smi_used_mib": {"before": before, "loaded": loaded}}


# --- the plans made beforehand --------------------------------------------------------------------

# The GPU that is lent (an H200 as nvidia-smi read it there, KINDS.md: 143771 MiB, driver 580.159).
PLANNED_GPU = Gpu("NVIDIA H200", "9.0", "580.159.03", 143771, "13.0")
# name, topology, fitplan plan options: budgets small enough that the placement has to choose
PLANS: dict[str, tuple[tuple[str, str, tuple[str, ...]], ...]] = {
    "cuda": (
        ("one-1g", ONE, ("-c", "4096", "--max-vram", "CUDA0=1GiB")),
        ("one-300m", ONE, ("-c", "4096", "--max-vram", "CUDA0=300MiB")),
        ("one-32k-700m", ONE, ("-c", "32768", "--max-vram", "CUDA0=700MiB")),
        ("three-80m", THREE, ("-c", "4096", "--max-vram", "RPC0=150MiB,RPC1=150MiB,CUDA0=80MiB")),
        ("three-np4", THREE, ("-c", "8192", "-np", "4", "--max-vram", "RPC0=120MiB,RPC1=120MiB,CUDA0=100MiB")),
    ),
    "cpu": (
        ("one-host", ONE, ("-c", "4096", "--max-ram", "2GiB")),
        ("one-host-32k", ONE, ("-c", "32768", "--max-ram", "3GiB")),
        ("three-300m", THREE, ("-c", "4096", "--max-vram", "RPC0=300MiB,RPC1=300MiB")),
        ("three-60m", THREE, ("-c", "4096", "--max-vram", "RPC0=60MiB,RPC1=80MiB")),
        ("three-np4", THREE, ("-c", "16384", "-np", "4", "--max-vram", "RPC0=100MiB,RPC1=100MiB")),
    ),
}
PLAN_ENDPOINTS = ["127.0.0.1:50052", "127.0.0.1:50053"]


def make_plans(backends: list[str]) -> int:
    """`fitplan plan` for each entry of PLANS against the inventory `measure` will describe; the
    flags it prints are what the GPU machine loads. Written to scripts/gpu_peer_plans.json."""
    import tempfile

    import yaml

    doc = json.loads(PLANS_FILE.read_text()) if PLANS_FILE.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        models = write_models(Path(tmp) / "models", random_gemma=False)
        for backend in backends:
            gpu = PLANNED_GPU if backend == "cuda" else None
            entries = []
            for name, topology, options in PLANS[backend]:
                inv = Path(tmp) / f"{backend}-{topology}.yaml"
                inv.write_text(yaml.safe_dump(inventory(backend, topology, gpu, PLAN_ENDPOINTS)))
                document = Path(tmp) / f"{backend}-{name}.yaml"
                argv = [sys.executable, "-m", "planner.cli", "plan", str(models["gemma3-270m"]), "--devices",
                        str(inv), *options, "--format", "json", "-o", str(document)]
                done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=REPO)
                if done.returncode != 0:
                    print(f"gpu_peer: plan {backend} {name} failed: {done.stderr.strip()}", file=sys.stderr)
                    return 1
                plan = json.loads(done.stdout)
                plan_argv = [str(a) for a in yaml.safe_load(document.read_text())["argv"]]   # the vector itself
                if plan_argv[:1] == ["-m"]:   # the model is the GPU machine's own copy: measure names it
                    plan_argv = plan_argv[2:]
                budgets = {d["name"]: d["budget_bytes"] // MIB for d in plan["devices"] if d.get("budget_bytes")}
                entries.append({
                    "name": name, "model": "gemma3-270m", "topology": topology,
                    "fitplan": shlex.join(["fitplan", "plan", "MODEL", "--devices", f"{backend}-{topology}.yaml",
                                           *options]),
                    "argv": [a.replace(",".join(PLAN_ENDPOINTS), "{rpc_endpoints}") for a in plan_argv],
                    "n_parallel": plan["n_parallel"],
                    "budgets_mib": budgets,
                    "estimate_mib": {d["name"]: [d["model_bytes"] // MIB, d["context_bytes"] // MIB,
                                                 round(d["compute_bytes"] / MIB, 2)] for d in plan["devices"]},
                })
                print(f"gpu_peer: {backend} {name}: {plan['flags']}")
            doc[backend] = entries
    PLANS_FILE.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


# --- speed: llama-bench on the measured devices ------------------------------------------------------

# What the throughput model is checked against on a real GPU (bench/bench_gpu_throughput.py replays these
# rows here): placements listed before any measurement, each one llama-bench process of pp512 and tg32,
# three repeats. The weights are the sparse files' zero blocks (Gemma's random ones): a quantized matmul
# reads its bytes whatever they hold. On the CPU backend (the rehearsal) only the Gemma rows run.
SPEED_WORK = Workload(n_prompt=512, n_gen=32, repeats=3)
SPEED: tuple[tuple[str, str, str, int], ...] = (
    # model, topology, flags, depth (llama-bench -d)
    ("gemma3-270m", ONE, "-ngl 99", 0),
    ("gemma3-270m", ONE, "-ngl 99", 4096),
    ("gemma3-270m", ONE, "-ngl 9", 0),
    ("gemma3-270m", ONE, "-ngl 0", 0),
    ("gemma3-270m", ONE, "-ngl 0 --no-op-offload", 0),
    ("llama-8b", ONE, "-ngl 99", 0),
    ("llama-8b", ONE, "-ngl 99", 4096),
    ("llama-8b", ONE, "-ngl 99 -ub 128", 0),
    ("llama-8b", ONE, "-ngl 24", 0),
    ("llama-8b", ONE, "-ngl 16", 0),
    ("llama-8b", ONE, "-ngl 0", 0),
    ("llama-8b", ONE, "-ngl 99 -ot output.weight=CPU", 0),
    ("llama-8b", ONE, "-ngl 99 -ot output.weight=CPU --no-op-offload", 0),
    ("qwen3-8b", ONE, "-ngl 99", 0),
    ("qwen3moe-30b-a3b", ONE, "-ngl 99", 0),
    ("qwen3moe-30b-a3b", ONE, "-ngl 99 -ot exps=CPU", 0),
    ("gpt-oss-20b", ONE, "-ngl 99", 0),
    ("deepseek2-mla", ONE, "-ngl 99", 0),
    ("llama-8b", THREE, "-ngl 99 -ts {ts:1,1,1}", 0),
    ("gemma3-270m", THREE, "-ngl 99 -ts {ts:1,1,1}", 0),
)


def speed_rows(bin_dir: Path, models: dict[str, Path], endpoints: list[str], backend: str,
               deadline: float) -> tuple[list[dict], list[dict]]:
    """llama-bench for each SPEED row: its argv, workload and the JSON rows it printed."""
    rows, failures = [], []
    n_gpu_like = 3 if backend == "cuda" else 2
    for name, topology, template, depth in SPEED:
        if backend == "cpu" and name != "gemma3-270m":
            continue
        flags = expand(template, [], n_gpu_like)
        rpc = endpoints if topology == THREE else []
        work = replace(SPEED_WORK, n_depth=depth)
        entry = {"model": name, "topology": topology, "flags": shlex.join(flags), "rpc": rpc,
                 "workload": asdict(work)}
        if time.monotonic() > deadline:
            failures.append({**entry, "error": "out of time"})
            continue
        argv = llama_bench_argv(bin_dir, str(models[name]), flags, work, rpc)
        t0 = time.monotonic()
        try:
            bench, stolen = bench_rows(argv, flags)
        except BenchError as e:
            failures.append({**entry, "error": str(e)})
            print(f"gpu_peer: speed FAILED {name} {template}: {e}", flush=True)
            continue
        rows.append({**entry, "argv": shlex.join(argv[1:]), "bench": bench, "stolen": stolen,
                     "seconds": round(time.monotonic() - t0, 1)})
        tg = [r["avg_ts"] for r in bench if r.get("n_gen")]
        pp = [r["avg_ts"] for r in bench if r.get("n_prompt")]
        print(f"gpu_peer: speed {name:18} {shlex.join(flags):28} -d {depth:<5} tg {tg} pp {pp}", flush=True)
    return rows, failures


# --- the record ----------------------------------------------------------------------------------

def detect_gpu() -> Gpu:
    done = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version,memory.total",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30, check=True)
    name, cc, driver, total = (x.strip() for x in done.stdout.splitlines()[0].split(","))
    header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30, check=False).stdout
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", header)
    return Gpu(name, cc, driver, int(total), cuda.group(1) if cuda else "")


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""
    m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return m.group(1).strip() if m else ""


def _tool_version(bin_dir: Path) -> str:
    done = subprocess.run([str(bin_dir / "llama-server"), "--version"], capture_output=True, text=True,
                          timeout=60, check=False)
    return " ".join((done.stdout + done.stderr).split("\n")[-3:]).strip()


def _list_devices(bin_dir: Path, rpc: list[str]) -> list[str]:
    # --rpc before --list-devices: the list is printed when its flag is parsed (common/arg.cpp)
    argv = [str(bin_dir / "llama-server")] + (["--rpc", ",".join(rpc)] if rpc else []) + ["--list-devices"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    return [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if re.match(r"\s*\w+\d+: ", ln)]


def _plan_argv(plans: list[dict], template: str, endpoints: list[str]) -> list[str]:
    """A plan's llama.cpp argv with this run's rpc endpoints, and its slot count said outright:
    llama-server's -np defaults to 4 slots (a unified cache), llama-fit-params' to 1, and the plan
    was made for `n_parallel` slots."""
    [plan] = [p for p in plans if "plan:" + p["name"] == template]
    argv = [a.replace("{rpc_endpoints}", ",".join(endpoints)) for a in plan["argv"]]
    return argv if "-np" in argv else [*argv, "-np", str(plan["n_parallel"])]


def measure(args: argparse.Namespace) -> int:
    start = time.monotonic()
    budget_s = float(os.environ.get("FITPLAN_GPU_PEER_BUDGET_S", "240"))
    bin_dir, work = Path(args.bin), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    backend = args.backend
    gpu = detect_gpu() if backend == "cuda" else None
    models = write_models(work / "models", random_gemma=True)
    print(f"gpu_peer: models written in {time.monotonic() - start:.1f} s", flush=True)
    n_gpu_like = 3 if backend == "cuda" else 2
    plans = json.loads(PLANS_FILE.read_text())[backend]
    rows, failures, loads = [], [], []
    with rpc_servers(2, bin_dir) as endpoints:
        doc = {
            "schema": 1,
            "backend": backend,
            "description": ("llama.cpp's own figures on " + (gpu.name if gpu else "the CPU backend (a rehearsal)")
                            + ": llama-fit-params --fit-print on rows (MiB, floor of bytes) and llama-server real "
                              "loads of plans fitplan made beforehand (scripts/gpu_peer_plans.json)"),
            "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"system": platform.platform(), "cpus": os.cpu_count(), "cpu": _cpu_model()},
            "gpu": gpu.__dict__ if gpu else None,
            "llama_cpp": {"pin": "llama-cpp-python==0.3.36 (llama.cpp 0c1e570)", "version": _tool_version(bin_dir),
                          "build": Path(args.version_file).read_text().strip().splitlines()
                          if Path(args.version_file).exists() else []},
            "devices_listed": {ONE: _list_devices(bin_dir, []), THREE: _list_devices(bin_dir, endpoints)},
            "rpc_endpoints": endpoints,
            "inventory": {t: inventory(backend, t, gpu, endpoints) for t in (ONE, THREE)},
            "models": {n: {"file": p.name, "header_sha256": read_model(p).header_sha256, "bytes": p.stat().st_size}
                       for n, p in models.items()},
        }
        # the plans' own flags are rows of the matrix too (llama-server-only -np left as planned)
        planned = tuple((plan["model"], plan["topology"], "plan:" + plan["name"]) for plan in plans)
        for name, topology, template in MATRIX + planned:
            if time.monotonic() - start > budget_s:
                failures.append({"model": name, "topology": topology, "flags": template, "error": "out of time"})
                continue
            argv = (_plan_argv(plans, template, endpoints) if template.startswith("plan:")
                    else expand(template, endpoints if topology == THREE else [], n_gpu_like))
            t0 = time.monotonic()
            try:
                devices = fit_print(bin_dir, models[name], argv)
                if not devices:
                    raise RuntimeError("llama-fit-params printed no rows")
            except (ToolsError, RuntimeError, subprocess.TimeoutExpired) as e:
                failures.append({"model": name, "topology": topology, "flags": template, "error": str(e)})
                print(f"gpu_peer: FAILED {name} {template}: {e}", flush=True)
                continue
            rows.append({"model": name, "topology": topology, "flags": template, "argv": shlex.join(argv),
                         "devices": devices, "seconds": round(time.monotonic() - t0, 2)})
            print(f"gpu_peer: {name:18} {shlex.join(argv)[:70]:70} {devices}", flush=True)
        for plan in plans:
            argv = _plan_argv(plans, "plan:" + plan["name"], endpoints)
            try:
                result = real_load(bin_dir, models[plan["model"]], argv, work / f"load-{plan['name']}.log")
            except (ToolsError, RuntimeError, OSError, subprocess.SubprocessError) as e:
                result = {"ok": False, "error": str(e),
                          "log_tail": (work / f"load-{plan['name']}.log").read_text(errors="replace")[-2000:]}
            loads.append({"plan": plan["name"], "model": plan["model"], "topology": plan["topology"],
                          "argv": shlex.join(argv), "budgets_mib": plan["budgets_mib"], **result})
            print(f"gpu_peer: load {plan['name']}: ok={result.get('ok')} {result.get('breakdown')}", flush=True)
        doc.update({"rows": rows, "failures": failures, "loads": loads})
        out = _write(doc, Path(args.out), gpu, start)   # what is measured so far survives a later stop
        speed_s = float(os.environ.get("FITPLAN_GPU_PEER_SPEED_S", "150"))
        speed, speed_failures = speed_rows(bin_dir, models, endpoints, backend, time.monotonic() + speed_s)
    doc.update({"speed": speed, "speed_failures": speed_failures})
    _write(doc, out, gpu, start)
    print(f"gpu_peer: {len(rows)} rows, {len(failures)} failures, {len(loads)} loads, {len(speed)} speed rows "
          f"({len(speed_failures)} not run) in {doc['wall_s']} s -> {out}")
    return 0 if rows and not failures and all(ld.get("ok") for ld in loads) else 1


def _write(doc: dict, out: Path, gpu: Gpu | None, start: float) -> Path:
    """The record, written whole (a partial file is renamed into place): a directory gets a file named
    after the device (tests/peer/data/cuda/nvidia-h200.json)."""
    doc["wall_s"] = round(time.monotonic() - start, 1)
    if out.is_dir():
        out = out / (re.sub(r"[^a-z0-9]+", "-", gpu.name.lower()).strip("-") + ".json" if gpu else "rehearsal.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--backend", choices=("cuda", "cpu"), required=True)
    m.add_argument("--bin", required=True)
    m.add_argument("--work", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--version-file", default="")
    p = sub.add_parser("plans")
    p.add_argument("--backend", choices=("cuda", "cpu"), action="append")
    args = parser.parse_args(argv)
    if args.cmd == "measure":
        return measure(args)
    return make_plans(args.backend or ["cuda", "cpu"])


if __name__ == "__main__":
    raise SystemExit(main())
