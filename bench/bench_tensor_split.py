"""`fitplan estimate -- -sm tensor` against llama.cpp's dry run, every row side by side.

    python -m bench.bench_tensor_split                  # the peer matrix plus flag variants
    python -m bench.bench_tensor_split --only llama-8b

Starts three ggml-rpc-servers on 127.0.0.1, then for every builder architecture the pinned build
splits (tests/support/tensor_split.py) over 2 and 3 servers at two contexts, and for a few flag
variants on the Llama-8B shape (-ngl 16, -ts 3,1, -np 4, q8_0 caches, -ub 128, -nkvo), prints per row
(Meta(), Host) model / context / compute MiB as fitplan / llama-fit-params give them, and whether
each row is within the peer test's tolerance. Refused architectures print both refusals' first line.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from planner.core.errors import FitplanError
from planner.llama.placement import CPU_REPACK
from planner.memory.estimate import estimate
from planner.running.tool_runs import fit_print
from planner.system.llama_tools import ensure_tools, rpc_servers
from tests.support.estimate_matrix import compute_ok, model_path
from tests.support.tensor_split import CONTEXTS, REFUSED_MODELS, RPC_COUNTS, SPLIT_MODELS

MIB = 2**20
VARIANTS: tuple[tuple[str, ...], ...] = (("-ngl", "16"), ("-ts", "3,1"), ("-np", "4"), ("-ctk", "q8_0", "-ctv", "q8_0"),
                                          ("-ub", "128"), ("-nkvo",))


def _row(label: str, bin_dir: Path, path: Path, argv: list[str]) -> bool:
    theirs = fit_print(bin_dir, path, argv)
    est = estimate(str(path), argv)
    ok = True
    for d in est.devices:
        if d.name == CPU_REPACK:
            continue
        tm, tc, tk = theirs[d.name]
        mm, mc, mk = d.model_bytes // MIB, d.context_bytes // MIB, d.compute_bytes / MIB
        good = (mm, mc) == (tm, tc) and compute_ok(mk, tk, est.compute_model)
        ok &= good
        print(f"{label:44} {d.name:7} {mm:>6}/{tm:<6} {mc:>6}/{tc:<6} {mk:>7.1f}/{tk:<6} {'ok' if good else 'MISS'}")
    return ok


def _refusal(label: str, bin_dir: Path, path: Path, argv: list[str]) -> None:
    done = subprocess.run([str(bin_dir / "llama-fit-params"), "-m", str(path), "--fit-print", "on", *argv],
                          capture_output=True, text=True, timeout=300, check=False)
    theirs = next((ln for ln in done.stderr.splitlines() if "SPLIT_MODE_TENSOR" in ln), f"rc {done.returncode}")
    try:
        estimate(str(path), argv)
        mine = "accepted"
    except FitplanError as err:
        mine = str(err)
    print(f"{label:44} llama.cpp: {theirs.strip()[-110:]}\n{'':44} fitplan:   {mine[:160]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="one model of the matrix")
    args = parser.parse_args()
    bin_dir = ensure_tools()
    models = [m for m in SPLIT_MODELS if not args.only or m == args.only]
    misses = 0
    print(f"{'row':44} {'device':7} {'model fitplan/llama.cpp':>13} {'context':>13} {'compute':>14}")
    with tempfile.TemporaryDirectory() as tmp, rpc_servers(max(RPC_COUNTS), bin_dir) as eps:
        for name in models:
            path = model_path(name, Path(tmp))
            for n in RPC_COUNTS:
                for n_ctx in CONTEXTS:
                    argv = ["--rpc", ",".join(eps[:n]), "-sm", "tensor", "-c", str(n_ctx)]
                    misses += not _row(f"{name} x{n} -c {n_ctx}", bin_dir, path, argv)
        if not args.only or args.only == "llama-8b":
            path = model_path("llama-8b", Path(tmp))
            for extra in VARIANTS:
                argv = ["--rpc", ",".join(eps[:2]), "-sm", "tensor", "-c", "4096", *extra]
                misses += not _row(f"llama-8b x2 -c 4096 {' '.join(extra)}", bin_dir, path, argv)
        for name in REFUSED_MODELS if not args.only else ():
            path = model_path(name, Path(tmp))
            _refusal(f"{name} x2 -c 4096", bin_dir, path, ["--rpc", ",".join(eps[:2]), "-sm", "tensor", "-c", "4096"])
    print(f"rows outside the peer tolerance: {misses}")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
