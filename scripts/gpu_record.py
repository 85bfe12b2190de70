"""The next GPU record (issue 42 item 5), one command on a lent NVIDIA GPU:

    PYTHONPATH=$PWD python scripts/gpu_record.py --bin DIR --out tests/peer/data/cuda/<gpu>-overhead.json
    PYTHONPATH=$PWD python scripts/gpu_record.py --cpu --bin ~/.cache/fitplan/llama.cpp-0.3.36-portable/bin \
        --out /tmp/rehearsal.json                     # the rehearsal on the CPU build: same steps, small models

Three parts, each row written to the record as it is measured (a part that fails keeps its error):
(a) fill-to-budget loads: for each model, `fitplan plan --ctx max` with the default budgets on the detected
    inventory; llama-server loads the printed flags, answers one completion, and nvidia-smi's used memory
    (before, loaded) and the memory breakdown at exit are kept, with the plan's rows and overhead;
(b) the memory outside the breakdown per process kind: one-device llama-server loads of the small model at
    -fa on/off x -ub 512/2048 (growth minus breakdown), and one idle rpc-server (its used memory);
(c) llama-bench per weight type (Q4_K, Q6_K, Q8_0, MXFP4, F16: a Llama-shaped file whose matrices are all
    that type): prompt processing at -ub 128/512/2048 and generation, for the throughput model's measured
    GPU matmul rate per weight type (fit on some rows, check on the others).
`--cpu` runs the same steps on the CPU build with host-only plans and tiny files (nvidia-smi figures are then
null): the rehearsal that the script runs end to end. Everything it writes is read back by
tests/peer/test_gpu_overhead.py (part a and b) and bench/bench_gpu_throughput.py (part c) once a GPU record
exists.
"""
from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from planner.api import plan
from planner.core.errors import FitplanError
from planner.hardware.detect import detect_inventory
from planner.measuring.llama_bench import BenchError, Workload, bench_rows, llama_bench_argv
from planner.search.result import llama_argv
from planner.synth.gguf_factory import Q, llama_spec
from planner.synth.shapes_common import gemma3_270m_layout, tokenized
from planner.synth.shapes_consumer import CONSUMER_SHAPES, write_consumer_shape
from planner.system.llama_tools import ToolsError, rpc_servers
from scripts.gpu_peer import fill_random, nvidia_smi_used_mib, real_load

SMALL = "gemma3-270m"
FILL_MODELS = tuple(CONSUMER_SHAPES)                # the 48-plan matrix's models
OUTSIDE_FLAGS = tuple((fa, ub) for fa in ("on", "off") for ub in (512, 2048))
WEIGHT_TYPES = {"Q4_K": Q.Q4_K, "Q6_K": Q.Q6_K, "Q8_0": Q.Q8_0, "MXFP4": Q.MXFP4, "F16": Q.F16}
BENCH_UBATCH = (128, 512, 2048)


def typed_model(qtype: Q, directory: Path, cpu: bool) -> Path:
    """A Llama-shaped file whose matrices are all `qtype` (random data on a GPU run: real bytes to read)."""
    path = directory / f"llama-{qtype.name.lower()}{'-tiny' if cpu else ''}.gguf"
    if path.exists():
        return path
    dims = dict(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=1024) if cpu else \
        dict(n_layer=16, n_embd=2048, n_head=16, n_head_kv=8, n_ff=8192, n_vocab=32768)
    spec = llama_spec(**dims, attn_type=qtype, v_type=qtype, ffn_type=qtype, down_type=qtype,
                      embd_type=Q.Q8_0 if qtype is Q.MXFP4 else qtype, out_type=Q.Q8_0 if qtype is Q.MXFP4 else qtype)
    [written] = tokenized(spec, dims["n_vocab"], 4096).write(directory / f"{path.stem}.partial.gguf")
    written.rename(path)
    return path


def small_model(directory: Path) -> Path:
    path = directory / f"{SMALL}.gguf"
    if not path.exists():
        [written] = gemma3_270m_layout().write(directory / f"{SMALL}.partial.gguf")
        fill_random(written)
        written.rename(path)
    return path


def fill_loads(bin_dir: Path, models: Path, logs: Path, cpu: bool) -> list[dict]:
    """(a): each model planned with the default budgets at --ctx max on this machine, loaded, asked once."""
    rows = []
    inventory = detect_inventory(use_llama=True)
    names = (SMALL,) if cpu else FILL_MODELS
    for name in names:
        path = small_model(models) if name == SMALL else write_consumer_shape(name, models)
        row: dict = {"model": name}
        try:
            result = plan(str(path), devices=inventory, max_ctx=True)
            row.update(argv=shlex.join(llama_argv(result)), n_ctx=result.n_ctx,
                       rows={d.name: [d.model_bytes, d.context_bytes, d.compute_bytes, d.overhead_bytes]
                             for d in result.estimate.totals},
                       budgets={n: b for n, b in result.budgets.rows().items()})
            row.update(real_load(bin_dir, path, llama_argv(result), logs / f"fill-{name}.log"))
        except (FitplanError, ToolsError, OSError, RuntimeError, subprocess.SubprocessError) as exc:
            row["error"] = str(exc)
        rows.append(row)
        print(f"gpu_record: fill {name}: {row.get('ok', row.get('error'))}", flush=True)
    return rows


def outside_loads(bin_dir: Path, models: Path, logs: Path, cpu: bool) -> dict:
    """(b): the small model alone on the GPU (host-only on the CPU build) at -fa on/off x -ub 512/2048, and one idle
    rpc-server's used memory."""
    path = small_model(models)
    device = ["-dev", "none", "-ngl", "0"] if cpu else ["-dev", "CUDA0", "-ngl", "99"]
    loads = []
    for fa, ub in OUTSIDE_FLAGS:
        argv = [*device, "-c", "4096", "-fa", fa, "-ub", str(ub), "-fit", "off", "-np", "1"]
        try:
            loads.append({"argv": shlex.join(argv), **real_load(bin_dir, path, argv, logs / f"outside-{fa}-{ub}.log")})
        except (ToolsError, OSError, RuntimeError, subprocess.SubprocessError) as exc:
            loads.append({"argv": shlex.join(argv), "error": str(exc)})
        print(f"gpu_record: outside -fa {fa} -ub {ub}: {loads[-1].get('ok', loads[-1].get('error'))}", flush=True)
    before = nvidia_smi_used_mib()
    with rpc_servers(1, bin_dir):
        time.sleep(3)   # the server creates its context when it starts listening
        idle = nvidia_smi_used_mib()
    return {"llama_server": loads, "rpc_server": {"before": before, "idle": idle}}


def speed_rows(bin_dir: Path, models: Path, cpu: bool) -> list[dict]:
    """(c): llama-bench per weight type, prompt at each -ub and generation."""
    rows = []
    work = Workload(n_prompt=256 if cpu else 2048, n_gen=8 if cpu else 64, repeats=1 if cpu else 3)
    for label, qtype in WEIGHT_TYPES.items():
        path = typed_model(qtype, models, cpu)
        for ub in BENCH_UBATCH:
            flags = ["-ngl", "0" if cpu else "99", "-ub", str(ub)]
            argv = llama_bench_argv(bin_dir, str(path), flags, work, [])
            try:
                bench, stolen = bench_rows(argv, flags)
                rows.append({"weights": label, "flags": shlex.join(flags), "bench": bench, "stolen": stolen})
            except (BenchError, OSError) as exc:
                rows.append({"weights": label, "flags": shlex.join(flags), "error": str(exc)})
            print(f"gpu_record: bench {label} -ub {ub}: {'error' not in rows[-1]}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", required=True, help="the pinned llama.cpp build's bin directory")
    parser.add_argument("--out", required=True, help="the record to write (JSON)")
    parser.add_argument("--cpu", action="store_true", help="the rehearsal on a CPU build: host-only, tiny files")
    parser.add_argument("--work", help="where models and logs go (default: a temporary directory)")
    parser.add_argument("--parts", default="abc", help="which parts to run (a, b, c; default abc)")
    args = parser.parse_args(argv)
    bin_dir = Path(args.bin)
    work = Path(args.work or tempfile.mkdtemp(prefix="fitplan-gpu-record-"))
    models, logs = work / "models", work / "logs"
    models.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    doc: dict = {"schema": 1, "backend": "cpu" if args.cpu else "cuda",
                 "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "nvidia_smi_used_mib_at_start": nvidia_smi_used_mib()}
    out = Path(args.out)
    steps = {"a": ("fill_loads", lambda: fill_loads(bin_dir, models, logs, args.cpu)),
             "b": ("outside", lambda: outside_loads(bin_dir, models, logs, args.cpu)),
             "c": ("speed", lambda: speed_rows(bin_dir, models, args.cpu))}
    for part in args.parts:
        key, step = steps[part]
        started = time.monotonic()
        try:
            doc[key] = step()
        except Exception as exc:   # the record keeps what failed and goes on with the next part
            doc[key] = {"error": f"{type(exc).__name__}: {exc}"}
        doc[f"{key}_seconds"] = round(time.monotonic() - started, 1)
        out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"gpu_record: wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
