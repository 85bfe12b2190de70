"""Accuracy of `fitplan estimate` against llama.cpp's dry run over the peer-test matrix.

    python -m bench.bench_estimate_accuracy            # every row
    python -m bench.bench_estimate_accuracy --only llama-8b
    python -m bench.bench_estimate_accuracy --families # the architecture families' peer matrices

Prints, per row and device, model / context / compute MiB as fitplan and llama-fit-params
(--fit-print on) give them, with the compute error; then a summary: rows where model or
context differ from llama.cpp's MiB, and the worst compute row (abs and relative). `--families`
runs instead the rows of every tests/peer/test_arch_*_peer.py (their SHAPES over
tests/support/arch_matrix's flag sets) and counts the architectures. Starts three
ggml-rpc-servers on 127.0.0.1 for the multi-device rows and stops them at the end.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from planner.llama.context import model_context
from planner.llama.placement import CPU_REPACK
from planner.memory.estimate import estimate
from planner.running.tool_runs import fit_print
from planner.system.llama_tools import ensure_tools, rpc_servers
from tests.support import arch_matrix
from tests.support.estimate_matrix import compute_ok, expand, matrix, model_path

MIB = 2**20


class Tally:
    """Per device row: the exact columns, the compute error, by compute model (simulated or formula)."""

    def __init__(self) -> None:
        self.exact_misses: list[str] = []
        self.compute_misses: list[str] = []
        self.worst: dict[str, tuple[float, float, str]] = {}
        self.below: dict[str, tuple[float, str]] = {}
        self.n_checked: dict[str, int] = {}

    def add(self, label: str, device: str, kind: str, mine: tuple[int, int, float],
            theirs: tuple[int, int, int]) -> None:
        (mm, mc, mk), (tm, tc, tk) = mine, theirs
        err = mk - tk
        where = f"{label} [{device}]"
        self.n_checked[kind] = self.n_checked.get(kind, 0) + 1
        if (mm, mc) != (tm, tc):
            self.exact_misses.append(f"{where}: model {mm}/{tm} context {mc}/{tc}")
        if not compute_ok(mk, tk, kind):
            self.compute_misses.append(f"{where}: compute {mk:.1f}/{tk} ({kind})")
        if abs(err) > abs(self.worst.get(kind, (0.0, 0.0, ""))[0]):
            self.worst[kind] = (err, abs(err) / tk if tk else 0.0, where)
        if err < self.below.get(kind, (0.0, ""))[0]:
            self.below[kind] = (err, where)
        print(f"{label[:58]:58} {device:6} {mm:>6}/{tm:<6} {mc:>6}/{tc:<6} {mk:>7.1f}/{tk:<7} {err:>+7.1f} {kind}")

    def summary(self) -> None:
        counts = ", ".join(f"{n} {k}" for k, n in sorted(self.n_checked.items()))
        print(f"device rows checked: {sum(self.n_checked.values())} ({counts})")
        print(f"model/context rows off by a MiB or more: {len(self.exact_misses)}")
        for line in self.exact_misses:
            print(f"  {line}")
        print(f"compute rows outside their tolerance (simulated: 3 % or 4 MiB and at most 1 MiB below; "
              f"formula: 10 % or 16 MiB): {len(self.compute_misses)}")
        for line in self.compute_misses:
            print(f"  {line}")
        for kind, (err, rel, where) in sorted(self.worst.items()):
            print(f"worst {kind} compute row: {where}: {err:+.1f} MiB ({rel:.1%})")
        for kind, (err, where) in sorted(self.below.items()):
            print(f"most below llama.cpp ({kind}): {where}: {err:+.1f} MiB")


def family_shapes() -> dict[str, arch_matrix.ArchShape]:
    """Every shape of the architecture families' peer tests (tests/peer/test_arch_*_peer.py SHAPES)."""
    import importlib

    out: dict[str, arch_matrix.ArchShape] = {}
    for path in sorted((Path(__file__).resolve().parents[1] / "tests" / "peer").glob("test_arch_*_peer.py")):
        module = importlib.import_module(f"tests.peer.{path.stem}")
        out.update(getattr(module, "SHAPES", {}))
    return out


def run_families(bin_dir: Path, only: str | None) -> Tally:
    shapes = {n: s for n, s in family_shapes().items() if not only or n == only}
    tally = Tally()
    archs: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="fitplan-bench-") as tmp, rpc_servers(3, bin_dir) as endpoints:
        contexts = {}
        for name, template in arch_matrix.arch_rows(shapes):
            shape = shapes[name]
            if name not in contexts:
                [path] = shape.spec().write(Path(tmp) / f"{name}.gguf")
                contexts[name] = (path, model_context(str(path)))
                archs.add(contexts[name][1].model.architecture)
            path, ctx = contexts[name]
            argv = arch_matrix.expand(template, shape, endpoints)
            _compare(tally, bin_dir, path, ctx, argv, f"{name} {template}")
    print(f"\narchitectures: {len(archs)} ({', '.join(sorted(archs))}); files: {len(shapes)}")
    return tally


def _compare(tally: Tally, bin_dir: Path, path: Path, ctx, argv: list[str], label: str) -> None:
    theirs = fit_print(bin_dir, path, argv)
    est = estimate(ctx, argv)
    ours = {d.name: d for d in est.devices if d.name != CPU_REPACK}
    for device, figures in theirs.items():
        mine = ours.get(device)
        if mine is None:
            tally.exact_misses.append(f"{label}: {device} missing")
            continue
        tally.add(label, device, est.compute_model,
                  (mine.model_bytes // MIB, mine.context_bytes // MIB, mine.compute_bytes / MIB), figures)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="one model name of the matrix")
    parser.add_argument("--families", action="store_true", help="the architecture families' peer matrices")
    args = parser.parse_args()
    bin_dir = ensure_tools()
    if args.families:
        run_families(bin_dir, args.only).summary()
        return 0
    rows = [(m, f) for m, f in matrix() if not args.only or m == args.only]
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="fitplan-bench-") as tmp, rpc_servers(2, bin_dir) as endpoints:
        contexts = {}
        print(f"{'model / flags':58} {'device':6} {'model f/l':>13} {'context f/l':>13} {'compute f/l':>15} "
              f"{'err':>7} compute model")
        for name, template in rows:
            if name not in contexts:
                path = model_path(name, Path(tmp))
                contexts[name] = (path, model_context(str(path)))
            path, ctx = contexts[name]
            argv = expand(template, name, endpoints)
            _compare(tally, bin_dir, path, ctx, argv, f"{name} {template.replace('{rpc} ', 'rpc×2 ')}")
        print()
        tally.summary()
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
