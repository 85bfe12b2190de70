"""Waiting for a quiet machine before timing anything (bench_throughput, bench_verdict): on two shared
cores, other work skews every timing, so the benches measure only below a 1-minute load average."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator


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

