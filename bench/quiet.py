"""Waiting for a quiet machine before timing anything (bench_throughput, bench_verdict): on two shared
cores, other work skews every timing, so the benches measure only below a 1-minute load average."""
from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

from planner.checking.llama_bench import BenchJob, Timing, run_rounds
from planner.core.llama_tools import ensure_tools


class NotQuiet(Exception):
    """The machine stayed busy past the deadline."""


def load1() -> float:
    return os.getloadavg()[0]


def load_line() -> str:
    """The three load averages, as the benches print them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def wait_for_quiet(max_load: float, deadline: float, busy_loops: int = 0) -> None:
    """Return once the 1-minute load, less the `busy_loops` of cores_kept_awake (each always runnable), is
    below `max_load`; raise NotQuiet past `deadline` (time.monotonic)."""
    while load1() - busy_loops >= max_load:
        if time.monotonic() > deadline:
            raise NotQuiet(f"the 1-minute load average stayed at or above {max_load}"
                           f"{f' beyond {busy_loops} busy loops' if busy_loops else ''}; not measuring "
                           f"(load {load1():.2f})")
        print(f"  load average {load1():.2f} >= {max_load}"
              f"{f' + {busy_loops} busy loops' if busy_loops else ''}: waiting", flush=True)
        time.sleep(30)


def pin_to_cores(cores: str) -> list[int]:
    """Keep this process, and every process it starts from now on (llama-bench, rpc-servers), on `cores`
    ("0", "0,1"; "" leaves the scheduler free). Returns the cores it now runs on. A core this machine does
    not have is refused with SystemExit."""
    if not cores:
        return sorted(os.sched_getaffinity(0))
    try:
        wanted = {int(c) for c in cores.split(",")}
    except ValueError:
        raise SystemExit(f"--cores {cores!r}: expected core numbers like 0 or 0,1") from None
    have = os.sched_getaffinity(0)
    if not wanted <= have:
        raise SystemExit(f"--cores {cores!r}: this process may run only on cores {sorted(have)}")
    os.sched_setaffinity(0, wanted)
    return sorted(wanted)


_SPIN = ("import os, sys\n"
         "os.sched_setaffinity(0, {int(sys.argv[1])})\n"
         "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
         "while True:\n    pass\n")


@contextlib.contextmanager
def cores_kept_awake(cores: list[int]) -> Iterator[list[int]]:
    """While the body runs, one SCHED_IDLE busy loop per core: it runs only when nothing else wants the core,
    so the core never halts, and a process woken there (an rpc-server answering, llama-bench's thread resuming)
    starts without a wake-up through the hypervisor. Yields the loops' pids (none for no cores); each loop is
    stopped by its own process on exit."""
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN, str(c)], stdin=subprocess.DEVNULL) for c in cores]
    try:
        yield [proc.pid for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def host_round_args(ap: argparse.ArgumentParser, rounds: int) -> None:
    """The options host_rounds' benches share: processes a job, samples a process, tokens a sample, and how quiet
    the machine must be."""
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--n-gen", type=int, default=16)
    ap.add_argument("--max-load", type=float, default=1.5)
    ap.add_argument("--max-wait-s", type=float, default=1800)


def host_rounds(jobs: Sequence[BenchJob], rounds: int, max_load: float, max_wait_s: float, header: str
                ) -> list[list[Timing]]:
    """How the host-only probes (bench_sample_length, bench_weight_types) measure: wait for a quiet machine (or
    exit saying why), print `header` with the load, run the jobs in `rounds` processes each, round-robin, with
    both cores kept awake, and print the load at the end. Each job's timings, one per round."""
    try:
        wait_for_quiet(max_load, time.monotonic() + max_wait_s)
    except NotQuiet as e:
        sys.exit(str(e))
    print(f"{header}, load {load_line()}", flush=True)
    with cores_kept_awake(pin_to_cores("")):
        per_round = run_rounds(ensure_tools(), jobs, [], rounds)
    print(f"load average at end: {load_line()}")
    return per_round
