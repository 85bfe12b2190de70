"""Benchmark: the embedded runtime's prompt and generation speed beside llama-bench's, Gemma 3 270M.

Both on this machine's CPU (llama-bench with its default threads), the same sizes: a prompt of
P token ids and G generated tokens (llama-bench -p P -n G). The runtime is timed after its
weights are dequantized (validate does that at load), prompt and generation separately, best of
R runs. Prints tokens/s for both and the runtime/llama.cpp ratios; the aim is generation at no
less than a quarter of llama.cpp's CPU speed. -t sets the runtime's threads for large matrix
products (runtime/ggml/threads.py; default: the cores this process may use). --kernels ggml-avx2
times the bit-exact kernels (runtime/ggml/exact.py) instead of the default ones.
Run: python -m bench.bench_runtime_speed [-p 64] [-n 32] [-r 3] [-t N] [--kernels default|ggml-avx2]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import time

from planner.llama.flags import parse_llama_flags
from planner.registry.examples import resolve_model
from planner.system.llama_tools import tools_dir
from runtime.engine.runner import ModelRunner
from runtime.ggml import threads

AIM_GEN_RATIO = 0.25


def runtime_speed(model: str, n_prompt: int, n_gen: int, reps: int, kernels: str = "default") -> tuple[float, float]:
    runner = ModelRunner.load(model, parse_llama_flags(["-c", str(max(1024, n_prompt + n_gen))]), kernels=kernels)
    runner.dequantize_weights()
    best_pp = best_tg = float("inf")
    for r in range(reps):
        runner.reset()
        prompt = [2] + [(1000 + 7919 * i + r) % 262144 for i in range(n_prompt - 1)]
        t0 = time.perf_counter()
        logits = runner.decode(prompt, all_logits=False)
        best_pp = min(best_pp, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(n_gen):
            logits = runner.decode([int(logits[-1].argmax())], all_logits=False)
        best_tg = min(best_tg, time.perf_counter() - t0)
    return n_prompt / best_pp, n_gen / best_tg


def llama_bench_speed(model: str, n_prompt: int, n_gen: int, reps: int) -> tuple[float, float] | None:
    bin_dir = tools_dir()
    if bin_dir is None:
        return None
    done = subprocess.run([str(bin_dir / "llama-bench"), "-m", model, "-p", str(n_prompt), "-n", str(n_gen),
                           "-r", str(reps), "-o", "json"], capture_output=True, text=True, timeout=600, check=True)
    rows = json.loads(done.stdout)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] and not r["n_gen"])
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] and not r["n_prompt"])
    return float(pp), float(tg)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-p", type=int, default=64)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("-t", type=int, default=None, help="runtime threads for large products")
    ap.add_argument("--kernels", default="default", help="default | ggml-avx2")
    args = ap.parse_args()
    model = resolve_model("example:gemma3-270m")
    threads.set_threads(args.t)
    ours_pp, ours_tg = runtime_speed(model, args.p, args.n, args.r, args.kernels)
    print(f"runtime ({args.kernels} kernels)")
    print(f"runtime      prompt {ours_pp:8.1f} tokens/s   generation {ours_tg:7.1f} tokens/s"
          f"   ({threads.n_threads()} threads, {time.strftime('%H:%M:%S', time.gmtime())} UTC)")
    theirs = llama_bench_speed(model, args.p, args.n, args.r)
    if theirs is None:
        print("llama-bench not built (scripts/build_llama_cpp.sh): no ratio")
        return
    print(f"llama-bench  prompt {theirs[0]:8.1f} tokens/s   generation {theirs[1]:7.1f} tokens/s")
    ratio_tg = ours_tg / theirs[1]
    print(f"ratio        prompt {ours_pp / theirs[0]:8.3f}            generation {ratio_tg:7.3f}"
          f"   (aim: generation >= {AIM_GEN_RATIO}: {'met' if ratio_tg >= AIM_GEN_RATIO else 'not met'})")


if __name__ == "__main__":
    main()
