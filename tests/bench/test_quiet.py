"""bench/quiet.py's process placement: pinning to cores and the lowest-priority busy loops."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.quiet import cores_kept_awake, pin_to_cores


def test_no_cores_named_leaves_the_affinity_as_it_is():
    assert pin_to_cores("") == sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize("cores", ["999", "zero", "0,,1"])
def test_a_core_this_process_cannot_use_is_refused(cores):
    with pytest.raises(SystemExit, match="--cores"):
        pin_to_cores(cores)


def test_pinning_holds_for_the_processes_started_afterwards():
    # in a child, so that the test run keeps its own cores
    code = ("import os, subprocess, sys\n"
            "from bench.quiet import pin_to_cores\n"
            "print(pin_to_cores('0'))\n"
            "child = subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'],\n"
            "                       capture_output=True, text=True, check=True)\n"
            "print(child.stdout.strip())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.stdout.split("\n")[:2] == ["[0]", "[0]"]


def test_busy_loops_run_idle_class_on_their_core_and_stop_on_exit():
    core = min(os.sched_getaffinity(0))
    with cores_kept_awake([core]) as pids:
        assert len(pids) == 1
        deadline = time.monotonic() + 10
        # the loop sets its own affinity and class first thing; wait until it has
        while os.sched_getscheduler(pids[0]) != os.SCHED_IDLE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.sched_getscheduler(pids[0]) == os.SCHED_IDLE
        assert os.sched_getaffinity(pids[0]) == {core}
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)


def test_the_load_limit_discounts_the_busy_loops(monkeypatch):
    from bench import quiet
    monkeypatch.setattr(quiet.os, "getloadavg", lambda: (2.4, 2.0, 1.0))   # two loops and 0.4 of other work
    quiet.wait_for_quiet(1.5, time.monotonic() + 60, busy_loops=2)        # returns at once
    with pytest.raises(quiet.NotQuiet, match="beyond 2 busy loops"):
        quiet.wait_for_quiet(0.3, time.monotonic() - 1, busy_loops=2)
    with pytest.raises(quiet.NotQuiet, match="stayed at or above 1.5; not measuring"):
        quiet.wait_for_quiet(1.5, time.monotonic() - 1)
