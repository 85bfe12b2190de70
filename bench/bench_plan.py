"""Benchmarks for `fitplan plan`.

1. Speed: a 128-layer MoE header on 8 devices. fitplan's plan (in-process and as a whole CLI
   process) beside llama-fit-params on the same case: 8 ggml-rpc-servers on 127.0.0.1, each
   budget emulated with llama.cpp's --fit-target margin (reported free memory minus the budget).
2. Heterogeneous devices: 24 GiB at 1 TB/s beside 8 GiB at 300 GB/s. The throughput-optimal
   placement fitplan chooses, against llama.cpp's default proportional split (-ts unset: shares
   proportional to free memory), both predicted by the same throughput model.

    python -m bench.bench_plan [--skip-llama] [--runs N]

Prints figures; asserts nothing. Model files are sparse GGUFs written to a temporary folder.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from planner.core.units import GiB, MiB
from planner.hardware.budgets import fit_target_flag, fit_target_margins, resolve_budgets
from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.memory.estimate import estimate
from planner.model.costs import cost_table
from planner.search.result import (
    PlanRequest,
    llama_argv,
)
from planner.search.search import plan
from planner.speed.throughput import predict_estimate
from planner.synth.gguf_factory import (
    Q,
    add_tokenizer,
    llama_spec,
    qwen3moe_spec,
)

ROOT = Path(__file__).resolve().parent.parent
N_DEVICES = 8
DEVICE_BUDGET = 2 * GiB


def write_moe_128(directory: Path) -> Path:
    """A 128-layer MoE (qwen3moe layout): 2048 wide, 64 experts of width 768, 8 used; ~22 GB of weights."""
    spec = qwen3moe_spec(n_layer=128, n_embd=2048, n_head=16, n_head_kv=4, head_dim=128, n_expert=64,
                         n_expert_used=8, n_ff_exp=768, n_vocab=32000)
    add_tokenizer(spec, 32000, n_merges=1)
    spec.metadata["tokenizer.ggml.pre"] = "default"
    spec.metadata["{arch}.context_length"] = 32768
    spec.metadata["{arch}.rope.freq_base"] = 1000000.0
    [path] = spec.write(directory / "moe-128.gguf")
    return path


def write_llama_8b(directory: Path) -> Path:
    spec = llama_spec(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=128256,
                      attn_type=Q.Q4_K, v_type=Q.Q6_K, ffn_type=Q.Q4_K, down_type=Q.Q6_K, embd_type=Q.Q4_K,
                      out_type=Q.Q6_K)
    add_tokenizer(spec, 128256, n_merges=1)
    spec.metadata["tokenizer.ggml.pre"] = "default"
    spec.metadata["{arch}.context_length"] = 8192
    [path] = spec.write(directory / "llama-8b.gguf")
    return path


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float


def timed(run, runs: int) -> tuple[Timing, object]:
    """Wall milliseconds of `run()` over `runs` calls, and its last result."""
    times, result = [], None
    for _ in range(runs):
        t = time.perf_counter()
        result = run()
        times.append((time.perf_counter() - t) * 1e3)
    return Timing(statistics.median(times), min(times), max(times)), result


def plan_cli(model: Path, backend: str, endpoints: list[str], free: int, max_vram: str) -> list[str]:
    """`fitplan plan` on N devices named `<backend><i>`; RPC devices carry their endpoints."""
    argv = [sys.executable, "-m", "planner.cli", "plan", str(model), "--ctx", "8192", "--ram", "256GiB",
            "--max-vram", max_vram, "--format", "flags"]
    for i, e in enumerate(endpoints):
        argv += ["--device", f"{backend}{i}={free // MiB}MiB" + (f"@{e}" if backend == "RPC" else "")]
    return argv


def rpc_inventory(endpoints: list[str], free: int) -> Inventory:
    devices = tuple(DeviceSpec(f"RPC{i}", DeviceKind.RPC, Backend.RPC, free, free, 0, 0, 0, endpoint=e)
                    for i, e in enumerate(endpoints))
    return Inventory(devices, HostSpec(256 * GiB, 256 * GiB, 0, "bench host"))


def speed(model: Path, runs: int, skip_llama: bool) -> None:
    print(f"== plan speed: 128-layer MoE ({model.stat().st_size / GiB:.1f} GiB sparse), "
          f"{N_DEVICES} devices at {DEVICE_BUDGET // MiB} MiB each")
    fake = [f"127.0.0.1:{50100 + i}" for i in range(N_DEVICES)]
    free = 24 * GiB
    inv = rpc_inventory(fake, free)
    budget = f"{DEVICE_BUDGET // MiB}MiB"
    t, result = timed(lambda: plan(str(model), inv, PlanRequest(n_ctx=8192),
                                   max_vram=",".join(f"RPC{i}={budget}" for i in range(N_DEVICES))), runs)
    print(f"fitplan plan (in-process, header read included): median {t.median_ms:.0f} ms over {runs} runs "
          f"(min {t.min_ms:.0f}, max {t.max_ms:.0f})")
    print(f"  flags: {' '.join(llama_argv(result))}")
    on_dev = sum(d.model_bytes for d in result.estimate.devices if d.name.startswith("RPC"))
    print(f"  weights on devices: {on_dev / GiB:.2f} GiB; predicted decode {result.prediction.decode_tokens_s:.1f} t/s")
    notes = {"RPC": "RPC devices: the final check runs the runtime's allocator reserve",
             "CUDA": "8 CUDA-class devices: the best placement judged with and without op offload"}
    for backend, note in notes.items():
        argv = plan_cli(model, backend, fake, free, ",".join(f"{backend}{i}={budget}" for i in range(N_DEVICES)))
        t, _ = timed(lambda argv=argv: subprocess.run(argv, check=True, capture_output=True, cwd=ROOT), runs)
        print(f"fitplan plan (whole CLI process, {note}): median {t.median_ms:.0f} ms")
    if not skip_llama:
        _llama_fit_speed(model, runs)


def _llama_fit_speed(model: Path, runs: int) -> None:
    from planner.system.llama_tools import ensure_tools, rpc_servers

    bin_dir = ensure_tools()
    with rpc_servers(N_DEVICES) as endpoints:
        listed = subprocess.run([str(bin_dir / "llama-cli"), "--rpc", ",".join(endpoints), "--list-devices"],
                                capture_output=True, text=True, timeout=60).stdout
        free = _first_free_mib(listed) * MiB
        inv = rpc_inventory(endpoints, free)
        budgets = resolve_budgets(inv, ",".join(f"RPC{i}={DEVICE_BUDGET // MiB}MiB" for i in range(N_DEVICES)))
        argv = [str(bin_dir / "llama-fit-params"), "-m", str(model), "--rpc", ",".join(endpoints), "-c", "8192",
                *fit_target_flag(fit_target_margins(inv, budgets))]
        t, out = timed(lambda: subprocess.run(argv, capture_output=True, text=True, timeout=600), runs)
        print(f"llama-fit-params (same case, 8 rpc-servers): median {t.median_ms:.0f} ms (exit {out.returncode})")
        chosen = [line for line in out.stdout.splitlines() if line.strip()]
        print(f"  its answer: {' '.join(chosen)[:300]}")


def _first_free_mib(listed: str) -> int:
    for line in listed.splitlines():
        if "MiB free" in line:
            return int(line.split(",")[-1].split("MiB")[0].strip())
    raise SystemExit("llama-cli --list-devices listed no RPC device")


def heterogeneous(model: Path) -> None:
    print("\n== heterogeneous: CUDA0 24 GiB at 1000 GB/s + CUDA1 8 GiB at 300 GB/s, llama 8B class, ctx 8192")
    cuda0 = DeviceSpec("CUDA0", DeviceKind.GPU, Backend.CUDA, 24 * GiB, 24 * GiB, int(1000e9), int(80e12), int(25e9))
    cuda1 = DeviceSpec("CUDA1", DeviceKind.GPU, Backend.CUDA, 8 * GiB, 8 * GiB, int(300e9), int(20e12), int(25e9))
    inv = Inventory((cuda0, cuda1), HostSpec(64 * GiB, 60 * GiB, int(60e9), "bench host", int(1e12)))
    ctx = model_context(str(model))
    best = plan(ctx, inv, PlanRequest(n_ctx=8192, n_ubatch=512))
    proportional = parse_llama_flags(["-dev", "CUDA0,CUDA1", "-c", "8192", "-ngl", "all"])
    est = estimate(ctx, proportional, inv)
    pred = predict_estimate(ctx, cost_table(ctx.model, ctx.facts), est, inv)
    budgets = resolve_budgets(inv)
    fits = all(d.total_bytes <= budgets.devices[d.name] for d in est.devices if d.name in budgets.devices)
    print(f"{'placement':<34} {'flags':<44} {'decode t/s':>10} {'prefill t/s':>11}")
    print(f"{'llama.cpp default (proportional)':<34} {'-ngl all (-ts unset: 3:1 by free memory)':<44} "
          f"{pred.decode_tokens_s:>10.1f} {pred.prefill_tokens_s:>11.0f}   fits: {fits}")
    flags = " ".join(a for a in llama_argv(best) if a not in ("-dev", "CUDA0,CUDA1"))
    print(f"{'fitplan (throughput objective)':<34} {flags[:44]:<44} {best.prediction.decode_tokens_s:>10.1f} "
          f"{best.prediction.prefill_tokens_s:>11.0f}")
    print(f"  layers: proportional {dict((d, len(ids)) for d, ids in est.layers)}; "
          f"fitplan {dict((d, len(ids)) for d, ids in best.estimate.layers)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-llama", action="store_true", help="do not run llama-fit-params")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        speed(write_moe_128(Path(tmp)), args.runs, args.skip_llama)
        heterogeneous(write_llama_8b(Path(tmp)))


if __name__ == "__main__":
    main()
