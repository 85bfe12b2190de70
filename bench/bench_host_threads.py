"""What a partial offload costs the host's threads (session 12's probe, kept): llama-bench decode on the host
alone, on one loopback rpc-server alone, and split between them, with the host's OpenMP threads as llama-bench
leaves them and with them bound to cores (OMP_PROC_BIND=true OMP_PLACES=cores) or never sleeping
(OMP_WAIT_POLICY=active).

    python -m bench.bench_host_threads [--rounds 3] [--repeats 5] [--threads 2] [--max-load 1.5]

The pinned llama.cpp is built with OpenMP (scripts/build_llama_cpp.sh; CMake finds it). With a partial offload
the host computes its layers, then waits while the device computes the rest; its worker thread goes to sleep
and is woken for the next token's layers. The bench measures how much that costs against the bound and the
never-sleeping variants, which differ from the default in nothing else. Each variant runs --rounds times,
round-robin, with both cores kept awake (bench/quiet.py); a variant's figure is the median of its rounds'
medians. Prints figures; asserts nothing. The rpc-server it starts is stopped by its own process.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from bench.quiet import NotQuiet, cores_kept_awake, load_line, pin_to_cores, wait_for_quiet
from planner.core.llama_tools import ensure_tools, rpc_servers
from planner.gguf.examples import resolve_model

MODEL = "example:gemma3-270m"
BOUND = {"OMP_PROC_BIND": "true", "OMP_PLACES": "cores"}
ACTIVE = {"OMP_WAIT_POLICY": "active"}


@dataclass(frozen=True)
class Variant:
    name: str
    flags: tuple[str, ...]
    env: dict[str, str]


VARIANTS = (
    Variant("host alone", ("-ngl", "0"), {}),
    Variant("host alone, threads bound", ("-ngl", "0"), BOUND),
    Variant("RPC0 alone", ("-dev", "RPC0", "-ngl", "999"), {}),
    Variant("10 of 19 layers on RPC0", ("-dev", "RPC0", "-ngl", "10"), {}),
    Variant("10 of 19 layers on RPC0, threads bound", ("-dev", "RPC0", "-ngl", "10"), BOUND),
    Variant("10 of 19 layers on RPC0, threads never sleep", ("-dev", "RPC0", "-ngl", "10"), ACTIVE),
)


def decode_tokens_s(bin_dir: str, model: str, v: Variant, rpc: str, threads: int, repeats: int) -> float:
    """One llama-bench process: tg64, the median of its repeats."""
    argv = [os.path.join(bin_dir, "llama-bench"), "-m", model, "-o", "json", "-r", str(repeats), "-p", "0",
            "-n", "64", "-t", str(threads), "--rpc", rpc, *v.flags]
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **v.env}, check=False)
    if done.returncode != 0:
        sys.exit(f"llama-bench exited {done.returncode} for {v.name}: {done.stderr.strip().splitlines()[-1:]}")
    return statistics.median(json.loads(done.stdout)[0]["samples_ts"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="llama-bench -r")
    ap.add_argument("--threads", type=int, default=2, help="llama-bench -t for the host (2: its default here)")
    ap.add_argument("--max-load", type=float, default=1.5)
    ap.add_argument("--max-wait-s", type=float, default=1800)
    args = ap.parse_args()
    bin_dir, model = str(ensure_tools()), resolve_model(MODEL)
    cores = pin_to_cores("")
    try:
        wait_for_quiet(args.max_load, time.monotonic() + args.max_wait_s)
    except NotQuiet as e:
        sys.exit(str(e))
    print(f"== host threads and a partial offload: tg64, -t {args.threads}, {args.repeats} repeats × "
          f"{args.rounds} rounds, cores {cores} kept awake; load {load_line()}")
    measured: dict[str, list[float]] = {v.name: [] for v in VARIANTS}
    with cores_kept_awake(cores), rpc_servers(1) as (rpc,):
        for k in range(1, args.rounds + 1):
            for v in VARIANTS:
                measured[v.name].append(decode_tokens_s(bin_dir, model, v, rpc, args.threads, args.repeats))
            print(f"  round {k} of {args.rounds} done, load {load_line()}", flush=True)
    for v in VARIANTS:
        runs = measured[v.name]
        print(f"{v.name:<46} {statistics.median(runs):6.1f} tokens/s  (rounds: "
              f"{', '.join(f'{x:.1f}' for x in runs)})")


if __name__ == "__main__":
    main()
