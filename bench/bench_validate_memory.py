"""Benchmark: `fitplan validate`'s peak RSS against the model file's size.

Writes the Llama-3.1-8B-class Q4_K_M-like sparse file (planner/synth/shapes_common.py llama-8b: real
tensor names, shapes and types; the data a hole, read as zeros) unless --model names a file, runs
`fitplan validate MODEL --prompt-tokens P --gen-tokens G -- -c C` as a subprocess and prints the
file's size, the child's peak RSS (its rusage ru_maxrss, from wait4), their ratio against the
bar of 1.5 x the file, the exit status and the wall time. The dequant cache is the
default (25 % of MemAvailable) unless FITPLAN_DEQUANT_CACHE is set in the environment.
Run: python -m bench.bench_validate_memory [--model PATH] [-p 8] [-n 2] [-c 512] [--dir /tmp/fitplan-shapes]
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from planner.core.units import fmt_bytes
from planner.synth.shapes_common import write_shape
from runtime.ggml.dequant import ENV_CACHE, default_capacity

RSS_BAR = 1.5   # the bar: validate's peak RSS at most 1.5 x the model file


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a GGUF file (default: the llama-8b sparse shape)")
    ap.add_argument("--dir", default="/tmp/fitplan-shapes", help="where the sparse shape is written")
    ap.add_argument("-p", type=int, default=8, help="--prompt-tokens")
    ap.add_argument("-n", type=int, default=2, help="--gen-tokens")
    ap.add_argument("-c", type=int, default=512, help="llama.cpp -c")
    args = ap.parse_args()
    if args.model is None:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
        model = str(write_shape("llama-8b", Path(args.dir)))
    else:
        model = args.model
    size = os.path.getsize(model)
    argv = [sys.executable, "-m", "planner.cli", "validate", model, "--prompt-tokens", str(args.p),
            "--gen-tokens", str(args.n), "--", "-c", str(args.c)]
    print(f"model        {model}: {fmt_bytes(size)} ({size} bytes)")
    print(f"dequant cache {fmt_bytes(default_capacity())} ({ENV_CACHE}={os.environ.get(ENV_CACHE, 'unset')})")
    t0 = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = child.communicate()
    seconds = time.perf_counter() - t0
    # communicate() reaped the child (the only one): RUSAGE_CHILDREN's ru_maxrss is its peak, in KiB
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    sys.stdout.write(out.decode(errors="replace"))
    if err:
        sys.stdout.write("stderr: " + err.decode(errors="replace"))
    ratio = peak / size
    print(f"exit {child.returncode}; peak RSS {fmt_bytes(peak)} = {ratio:.2f} x the file "
          f"({'within' if ratio <= RSS_BAR else 'over'} the {RSS_BAR} x bar); {seconds:.1f} s")


if __name__ == "__main__":
    main()
