"""Time `fitplan inspect` against its 1 s target, in-process and as a whole CLI process.

Models: the bundled Gemma 3 270M (262k-token vocabulary) and a sparse 8B-class llama header
written here (32 layers, n_embd 4096, vocab 128256 with a real-size tokenizer: 128256 token
strings, token types and 280147 merges, like Llama 3's). Prints figures; asserts nothing.

    python -m bench.bench_inspect [--runs N]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from planner.gguf.reader import read_model
from planner.model.arch import model_facts
from planner.model.costs import cost_table
from planner.registry.examples import resolve_model
from planner.synth.gguf_factory import add_tokenizer, llama_spec

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 1.0


def write_8b(directory: Path) -> Path:
    spec = llama_spec(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=128256)
    add_tokenizer(spec, n_vocab=128256, n_merges=280147)
    [path] = spec.write(directory / "llama-8b-class-sparse.gguf")
    return path


def in_process(path: str) -> float:
    t0 = time.perf_counter()
    model = read_model(path)
    cost_table(model, model_facts(model), "f16", "f16")
    return time.perf_counter() - t0


def whole_cli(path: str, fmt: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "planner.cli", "inspect", path, "--format", fmt],
                   check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - t0


def report(name: str, path: str, runs: int) -> list[tuple[float, float]]:
    """(median, slowest) seconds of each way of running inspect on one model."""
    st = os.stat(path)
    print(f"\n{name}: {path}")
    print(f"  file {st.st_size / 2**20:,.1f} MiB apparent, {st.st_blocks * 512 / 2**20:,.1f} MiB on disk")
    worst = []
    for label, fn in [("read_model+model_facts+cost_table (in-process)", lambda: in_process(path)),
                      ("fitplan inspect, table (whole process)", lambda: whole_cli(path, "table")),
                      ("fitplan inspect --format json (whole process)", lambda: whole_cli(path, "json"))]:
        fn()  # warm the page cache once so runs compare like with like
        times = [fn() for _ in range(runs)]
        worst.append((statistics.median(times), max(times)))
        print(f"  {label:<50} median {statistics.median(times) * 1000:7.1f} ms   "
              f"min {min(times) * 1000:7.1f} ms   max {max(times) * 1000:7.1f} ms   ({runs} runs)")
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fitplan-bench-") as tmp:
        t0 = time.perf_counter()
        big = write_8b(Path(tmp))
        print(f"wrote the sparse 8B-class header in {time.perf_counter() - t0:.2f} s")
        worst = report("gemma3 270M (example:gemma3-270m)", resolve_model("example:gemma3-270m"), args.runs)
        worst += report("llama 8B-class, sparse", str(big), args.runs)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload average {load} on {os.cpu_count()} cores (other work inflates the process timings)")
    medians, slowest = max(m for m, _ in worst), max(s for _, s in worst)
    for label, value in (("slowest median", medians), ("slowest single run", slowest)):
        verdict = "within" if value < TARGET_S else "OVER"
        print(f"{label} {value * 1000:.1f} ms: {verdict} the {TARGET_S:.0f} s target")


if __name__ == "__main__":
    main()
