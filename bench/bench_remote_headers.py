"""What `fitplan plan` costs over HTTP: bytes, requests and wall time per model, cold and cached.

Each model of the peer matrix (tests/support/estimate_matrix.py: the sparse shape-faithful files of
planner/synth/shapes_common.py, plus the bundled Gemma 3 270M) and a Llama-3-70B-class file are served by a
loopback HTTP server (tests/support/http_server.py, with Range and ETags). `fitplan plan URL --device CUDA0=24GiB
--ram 64GiB` runs in-process three times: from the local file, over HTTP with an empty header
cache (cold), and again with the cache (cached: one conditional request answered 304). The
server counts the requests and body bytes. Prints a table; asserts nothing.

    python -m bench.bench_remote_headers [--only NAME]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
import time
from pathlib import Path

from planner.cli import main
from planner.gguf.reader import read_model
from planner.gguf.source import INITIAL_CHUNK
from planner.synth.shapes_common import llama_70b
from tests.support.estimate_matrix import MODELS, model_path
from tests.support.http_server import LoopbackServer

PLAN = ["--device", "CUDA0=24GiB", "--ram", "64GiB", "--format", "flags"]
MiB, GiB = 2**20, 2**30


def _plan(location: str) -> tuple[int, float]:
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["plan", location, *PLAN])
    return code, time.perf_counter() - t0


def measure(name: str, path: Path, server: LoopbackServer) -> dict[str, object]:
    url = server.serve_file(f"/{name}.gguf", path)
    _plan(str(path))   # the model's first plan fills in-process caches: every timed run finds them warm
    code, local_s = _plan(str(path))
    server.reset()
    _, cold_s = _plan(url)
    cold_requests, cold_bytes = server.requests(), server.body_bytes()
    server.reset()
    _, cached_s = _plan(url)
    header = read_model(path).header_bytes
    return {"name": name, "size": path.stat().st_size, "header": header, "exit": code, "local_s": local_s,
            "cold_requests": cold_requests, "cold_bytes": cold_bytes, "cold_s": cold_s,
            "cached_requests": server.requests(), "cached_bytes": server.body_bytes(), "cached_s": cached_s}


def print_table(rows: list[dict]) -> None:
    head = (f"{'model':<20} {'file':>9} {'header':>9} {'cold read':>10} {'over hdr':>9} {'% file':>7} {'req':>4} "
            f"{'cold s':>7} {'cached':>7} {'req':>4} {'cached s':>8} {'local s':>8} {'exit':>4}")
    print(head)
    print("-" * len(head))
    for r in rows:
        over = r["cold_bytes"] - r["header"]
        print(f"{r['name']:<20} {r['size'] / GiB:>7.2f}Gi {r['header'] / MiB:>7.2f}Mi {r['cold_bytes'] / MiB:>8.2f}Mi "
              f"{over / 1024:>7.0f}Ki {100 * r['cold_bytes'] / r['size']:>6.3f}% {r['cold_requests']:>4} "
              f"{r['cold_s']:>7.2f} {r['cached_bytes']:>6}B {r['cached_requests']:>4} {r['cached_s']:>8.2f} "
              f"{r['local_s']:>8.2f} {r['exit']:>4}")
    worst = max(r["cold_bytes"] - r["header"] for r in rows)
    big = [r for r in rows if r["size"] >= 10 * GiB]
    print(f"\nbytes read beyond the header: at most {worst / 1024:.0f} KiB (bound: one initial chunk, "
          f"{INITIAL_CHUNK // 1024} KiB)")
    if big:
        print(f"files of 10 GiB and more: at most {max(100 * r['cold_bytes'] / r['size'] for r in big):.4f} % "
              f"of the file read (bound 0.1 %)")
    print(f"cached runs: {sum(r['cached_bytes'] for r in rows)} body bytes over "
          f"{sum(r['cached_requests'] for r in rows)} requests (all 304)")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average {load} on {os.cpu_count()} cores; wall times are whole in-process `plan` runs, each after "
          f"a first plan of the model (local s: the same plan from the local file)")


def main_bench() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="one model name")
    args = parser.parse_args()
    names = [n for n in ("llama-70b", *MODELS) if args.only in (None, n)]
    with tempfile.TemporaryDirectory(prefix="fitplan-bench-remote-") as tmp:
        d = Path(tmp)
        os.environ["FITPLAN_HEADER_CACHE"] = str(d / "header-cache")   # a cold cache, not the user's
        server = LoopbackServer()
        try:
            rows = []
            for name in names:
                path = llama_70b().write(d / "llama-70b.gguf")[0] if name == "llama-70b" else model_path(name, d)
                rows.append(measure(name, path, server))
        finally:
            server.close()
    print_table(rows)


if __name__ == "__main__":
    main_bench()
