"""Waiting for a quiet machine before timing anything (bench_throughput, bench_verdict): on two shared
cores, other work skews every timing, so the benches measure only below a 1-minute load average."""
from __future__ import annotations

import os
import time


class NotQuiet(Exception):
    """The machine stayed busy past the deadline."""


def load1() -> float:
    return os.getloadavg()[0]


def load_line() -> str:
    """The three load averages, as the benches print them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def wait_for_quiet(max_load: float, deadline: float) -> None:
    """Return once the 1-minute load is below `max_load`; raise NotQuiet past `deadline` (time.monotonic)."""
    while load1() >= max_load:
        if time.monotonic() > deadline:
            raise NotQuiet(f"the 1-minute load average stayed at or above {max_load}; not measuring "
                           f"(load {load1():.2f})")
        print(f"  load average {load1():.2f} >= {max_load}: waiting", flush=True)
        time.sleep(30)
