"""How steady a placement's fastest decode sample is, for samples of different length (session 14's probe, kept).

    python -m bench.bench_sample_length [--processes 6] [--max-load 1.5]

On this 2-vCPU machine a llama-bench decode sample is only ever slowed by other work on the shared cores, in
dips of a second or so; a placement's figure is therefore the fastest of its samples (llama_bench.
fastest_timing). For about the same tokens a process, a few long samples or many short ones: a short sample
more often falls between two dips. The bench runs the bundled Gemma 3 on the host alone (one thread) in
--processes llama-bench processes per variant, the variants round-robin, both cores kept awake, and prints
each process's fastest sample and how far the processes lie apart (standard deviation over mean) — for the
fastest and for the median of each process's samples. Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import statistics

from bench.quiet import host_rounds
from planner.checking.llama_bench import BenchJob, Workload
from planner.gguf.examples import resolve_model

MODEL = "example:gemma3-270m"
HOST = ("-ngl", "0")
# (tokens a sample, samples a process): about 190 tokens a process each
VARIANTS = ((64, 3), (32, 6), (16, 10))


def spread(values: list[float]) -> float:
    """Standard deviation over mean."""
    return statistics.stdev(values) / statistics.mean(values)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument("--max-load", type=float, default=1.5)
    ap.add_argument("--max-wait-s", type=float, default=1800)
    args = ap.parse_args()
    model = resolve_model(MODEL)
    # llama-bench's JSON is read for a prompt and a decode test: a short prompt, not reported
    jobs = [BenchJob(model, HOST, Workload(n_prompt=32, n_gen=n, repeats=r, threads=1)) for n, r in VARIANTS]
    per_round = host_rounds(jobs, args.processes, args.max_load, args.max_wait_s,
                            f"== fastest decode sample per process: {MODEL}, host alone, -t 1, {args.processes} "
                            "processes a variant, round-robin")
    for (n_gen, repeats), timings in zip(VARIANTS, per_round, strict=True):
        fastest = [max(t.tg_samples) for t in timings]
        medians = [statistics.median(t.tg_samples) for t in timings]
        print(f"  tg{n_gen} x {repeats:<2}  fastest per process {' '.join(f'{x:6.2f}' for x in fastest)}  "
              f"apart {spread(fastest):5.1%}   medians apart {spread(medians):5.1%}")


if __name__ == "__main__":
    main()
