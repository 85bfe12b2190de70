"""What `fitplan choose` costs: a repository of twelve quantizations ranked over loopback, as a whole process.

The repository of tests/support/quant_repo.py (twelve quantizations of one small Llama-shaped model,
F16 and BF16 split into 2 and 3 shards: 15 GGUF files, plus an mmproj and a README) is served by the
loopback Hub fake (tests/support/fake_hub.py: the model API and `/resolve/` with Range and ETags).
`fitplan choose hf://org/Model-GGUF` runs as a process (`python -m planner.cli`), first with an empty
header cache (cold), then again (cached: each header a conditional request answered 304). The
server counts requests and body bytes (the listing's JSON included); the file headers' own size is
printed beside them. Wall time and the process's CPU time (user + system: what the wall time comes
to on an idle machine) are medians of the runs. Prints a table; asserts nothing
(tests/cli/test_choose.py does).

    python -m bench.bench_choose [--runs 3]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from planner.gguf.reader import read_header_bytes
from tests.support.fake_hub import FakeHuggingFace
from tests.support.http_server import LoopbackServer
from tests.support.quant_repo import MMPROJ, QUANTS, write_repo

REPO = "org/Model-GGUF"
BOX = ["--device", "CUDA0=640MiB", "--ram", "4GiB", "--max-ram", "160MiB", "--ctx", "8192"]
KiB, MiB = 2**10, 2**20


def _environment(endpoint: str, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_TOKEN_PATH", "HTTP_PROXY",
                                                            "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")}
    env.update({"HF_ENDPOINT": endpoint, "FITPLAN_HEADER_CACHE": str(cache / "headers"),
                "HF_HUB_CACHE": str(cache / "hub"), "LLAMA_CACHE": str(cache / "llama.cpp"),
                "HF_HOME": str(cache / "hf"), "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    return env


@dataclass(frozen=True)
class Run:
    wall_s: float
    cpu_s: float          # the process's user + system time: what a quiet machine's wall time comes to
    requests: int
    body_bytes: int


def _run(env: dict[str, str], server: LoopbackServer) -> tuple[Run, int, str]:
    server.reset()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "choose", f"hf://{REPO}", *BOX],
                          env=env, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    time.sleep(0.2)   # the server logs a request after answering it
    return Run(wall, cpu, server.requests(), server.body_bytes()), proc.returncode, proc.stdout + proc.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="cold and cached runs each (the median is printed)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = write_repo(root / "repo")
        ggufs = {p: f for p, f in files.items() if p.endswith(".gguf") and p != MMPROJ}
        headers = sum(len(read_header_bytes(str(f)).data) for f in ggufs.values())
        server = LoopbackServer()
        hub = FakeHuggingFace(server)
        hub.add(REPO, files)
        cold: list[Run] = []
        cached: list[Run] = []
        try:
            for i in range(args.runs):
                env = _environment(hub.endpoint, root / f"cache{i}")
                run, code, text = _run(env, server)
                if code != 0:
                    sys.exit(f"choose exited {code}:\n{text}")
                cold.append(run)
                cached.append(_run(env, server)[0])
        finally:
            server.close()
    print(f"{len(QUANTS)} quantizations in {len(ggufs)} GGUF files, their headers {headers / KiB:.0f} KiB together; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'run':<7} {'wall s (median)':>16} {'cpu s (median)':>15} {'requests':>9} {'body read':>11} "
          f"{'past headers':>13}")
    for name, runs in (("cold", cold), ("cached", cached)):
        last = runs[-1]
        past = max(0, last.body_bytes - headers) if name == "cold" else 0
        print(f"{name:<7} {statistics.median(r.wall_s for r in runs):>16.2f} "
              f"{statistics.median(r.cpu_s for r in runs):>15.2f} {last.requests:>9} "
              f"{last.body_bytes / KiB:>7.0f} KiB {past / KiB:>9.0f} KiB")
    lines = text.splitlines()
    print("\n" + "\n".join(lines[2:4 + len(QUANTS)]))

if __name__ == "__main__":
    main()
