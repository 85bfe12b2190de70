"""Accuracy of `fitplan estimate` against llama.cpp's dry run over the peer-test matrix.

    python -m bench.bench_estimate_accuracy            # every row
    python -m bench.bench_estimate_accuracy --only llama-8b

Prints, per row and device, model / context / compute MiB as fitplan and llama-fit-params
(--fit-print on) give them, with the compute error; then a summary: rows where model or
context differ from llama.cpp's MiB, and the worst compute row (abs and relative). Starts two
ggml-rpc-servers on 127.0.0.1 for the multi-device rows and stops them at the end.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from planner.core.llama_tools import ensure_tools, rpc_servers
from planner.llama.context import model_context
from planner.llama.placement import CPU_REPACK
from planner.memory.estimate import estimate
from tests.support.shapes import compute_ok, expand, fit_print, matrix, model_path

MIB = 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="one model name of the matrix")
    args = parser.parse_args()
    bin_dir = ensure_tools()
    rows = [(m, f) for m, f in matrix() if not args.only or m == args.only]
    exact_misses, compute_misses, worst = [], [], (0.0, 0.0, "")
    n_checked = 0
    with tempfile.TemporaryDirectory(prefix="fitplan-bench-") as tmp, rpc_servers(2, bin_dir) as endpoints:
        contexts = {}
        print(f"{'model / flags':58} {'device':6} {'model f/l':>13} {'context f/l':>13} {'compute f/l':>15} {'err':>7}")
        for name, template in rows:
            if name not in contexts:
                path = model_path(name, Path(tmp))
                contexts[name] = (path, model_context(str(path)))
            path, ctx = contexts[name]
            argv = expand(template, name, endpoints)
            theirs = fit_print(bin_dir, path, argv)
            ours = {d.name: d for d in estimate(ctx, argv).devices if d.name != CPU_REPACK}
            label = f"{name} {template.replace('{rpc} ', 'rpc×2 ')}"
            for device, (tm, tc, tk) in theirs.items():
                mine = ours.get(device)
                if mine is None:
                    exact_misses.append(f"{label}: {device} missing")
                    continue
                mm, mc, mk = mine.model_bytes // MIB, mine.context_bytes // MIB, mine.compute_bytes / MIB
                err = mk - tk
                n_checked += 1
                if (mm, mc) != (tm, tc):
                    exact_misses.append(f"{label}: {device} model {mm}/{tm} context {mc}/{tc}")
                if not compute_ok(mk, tk):
                    compute_misses.append(f"{label}: {device} compute {mk:.0f}/{tk}")
                rel = abs(err) / tk if tk else 0.0
                if abs(err) > abs(worst[0]):
                    worst = (err, rel, f"{label} [{device}]")
                print(f"{label[:58]:58} {device:6} {mm:>6}/{tm:<6} {mc:>6}/{tc:<6} {mk:>7.0f}/{tk:<7} {err:>+7.1f}")
    print()
    print(f"device rows checked: {n_checked}")
    print(f"model/context rows off by a MiB or more: {len(exact_misses)}")
    for line in exact_misses:
        print(f"  {line}")
    print(f"compute rows outside 10 % or 16 MiB: {len(compute_misses)}")
    for line in compute_misses:
        print(f"  {line}")
    print(f"worst compute row: {worst[2]}: {worst[0]:+.1f} MiB ({worst[1]:.1%})")
    _time_per_candidate(contexts, endpoints)
    return 0


def _time_per_candidate(contexts: dict, endpoints: list[str]) -> None:
    """The planner's path: a ModelContext built once, then one estimate per candidate flag set."""
    from planner.llama.flags import parse_llama_flags

    flags = parse_llama_flags(["--rpc", ",".join(endpoints), "-ts", "1,1", "-c", "4096", "-ncmoe", "4"])
    for name, (_, ctx) in contexts.items():
        n = 100
        start = time.perf_counter()
        for _ in range(n):
            estimate(ctx, flags)
        ms = (time.perf_counter() - start) / n * 1e3
        print(f"per-candidate estimate, {name} ({len(ctx.slots)} tensors): {ms:.2f} ms")


if __name__ == "__main__":
    sys.exit(main())
