"""The pieces of `fitplan serve` that need no llama.cpp: reading llama.cpp's memory breakdown and
buffer lines, the output rows llama-server reserves, the hardware comparison, the extra flags, and
signal forwarding. Expected figures come from the log lines as llama.cpp prints them."""
from __future__ import annotations

import os
import signal
import subprocess

import pytest

from planner.core.errors import BadInput
from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.llama.companions import server_outputs_max
from planner.llama.flags import parse_llama_flags
from planner.running.serve import _split_extra, forward_signals, hardware_difference, load_rows, shutdown_rows
from planner.running.tool_runs import parse_breakdown

MIB = 2**20
GIB = 2**30
# as the pinned llama-server logs them at -lv 4 (common/fit.cpp common_memory_breakdown_print)
BREAKDOWN = """\
0.02.127.445 I common_memory_breakdown_print: | memory breakdown [MiB]     | total    free    self   model   context   compute    unaccounted |
0.02.127.477 I common_memory_breakdown_print: |   - RPC0 (127.0.0.1:48467) | 24151 = 24151 + (  56 =    25 +      10 +      21) +         -56 |
0.02.127.484 I common_memory_breakdown_print: |   - RPC1 (127.0.0.1:42027) | 24151 = 24151 + ( 174 =   170 +       0 +       4) +        -174 |
0.02.127.491 I common_memory_breakdown_print: |   - Host                   |                   177 =   170 +       0 +       7                |
0.02.127.495 I common_memory_breakdown_print: |   - CPU_REPACK             |                    12 =    12 +       0 +       0                |
"""  # noqa: E501 (llama.cpp's lines as printed)
LOAD = """\
0.00.722.328 I load_tensors:   CPU_Mapped model buffer size =   170.00 MiB
0.00.722.330 I load_tensors: RPC0[127.0.0.1:48467] model buffer size =    65.16 MiB
0.00.722.347 I load_tensors: RPC0[127.0.0.1:42027] model buffer size =   170.00 MiB
0.01.469.997 I llama_kv_cache: RPC0[127.0.0.1:48467] KV buffer size =     6.00 MiB
0.01.478.074 I llama_kv_cache: RPC0[127.0.0.1:48467] KV buffer size =    11.25 MiB
0.01.616.510 I sched_reserve: RPC0[127.0.0.1:48467] compute buffer size =    16.29 MiB
0.01.616.511 I sched_reserve: RPC0[127.0.0.1:42027] compute buffer size =     1.01 MiB
0.01.616.512 I sched_reserve:        CPU compute buffer size =     8.66 MiB
0.01.616.513 I sched_reserve: graph: nodes = 727, splits = 3, input objects = 4, input tensors = 9
"""
ENDPOINTS = {"RPC0": "127.0.0.1:48467", "RPC1": "127.0.0.1:42027"}


def test_breakdown_rows_in_mib():
    rows = parse_breakdown("noise\n" + BREAKDOWN)
    assert rows == {"RPC0": (25 * MIB, 10 * MIB, 21 * MIB), "RPC1": (170 * MIB, 0, 4 * MIB),
                    "Host": (170 * MIB, 0, 7 * MIB), "CPU_REPACK": (12 * MIB, 0, 0)}
    # the estimate folds CPU_REPACK into Host; so does the comparison
    assert shutdown_rows(BREAKDOWN)["Host"] == (182 * MIB, 0, 7 * MIB)
    assert parse_breakdown("no table here") == {}


def test_load_rows_by_device():
    rows = load_rows(LOAD, ENDPOINTS)
    assert rows["RPC0"] == (round(65.16 * MIB), round(17.25 * MIB), round(16.29 * MIB))
    assert rows["RPC1"] == (170 * MIB, 0, round(1.01 * MIB))
    assert rows["Host"] == (170 * MIB, 0, round(8.66 * MIB))


@pytest.mark.parametrize("n_batch, n_parallel, n_draft, rows", [
    (2048, 1, 0, 1), (2048, 4, 0, 4), (2, 4, 0, 2), (2048, 2, 3, 8)])
def test_server_output_rows(n_batch, n_parallel, n_draft, rows):
    # server-context.cpp server_output_limits: min(n_batch, n_parallel * (1 + n_draft))
    assert server_outputs_max(n_batch, n_parallel, n_draft) == rows


def _gpu(name: str, free: int) -> DeviceSpec:
    return DeviceSpec(name, DeviceKind.GPU, Backend.CUDA, 24 * GIB, free, 0, 0, 0)


def test_hardware_difference_names_devices_and_memory():
    host = HostSpec(64 * GIB, 64 * GIB, 0, "")
    planned = Inventory((_gpu("CUDA0", 24 * GIB),), host)
    need = {"CUDA0": (10 * GIB, 2 * GIB, GIB), "Host": (GIB, 0, 0)}
    flags = parse_llama_flags([])
    assert hardware_difference(planned, planned, flags, need) == []
    assert hardware_difference(planned, Inventory((), host), flags, need) == [
        "the plan is for CUDA0; this machine has no GPU or RPC device"]
    short = hardware_difference(planned, Inventory((_gpu("CUDA0", 12 * GIB),), HostSpec(64 * GIB, 512 * MIB, 0, "")),
                                flags, need)
    assert short == ["CUDA0 has 12288 MiB free, the plan allocates 13312 MiB",
                     "the host has 512 MiB available, the plan allocates 1024 MiB"]
    # a second GPU here is harmless when the plan names its devices with -dev
    two = Inventory((_gpu("CUDA0", 24 * GIB), _gpu("CUDA1", 24 * GIB)), host)
    assert hardware_difference(planned, two, parse_llama_flags(["-dev", "CUDA0"]), need) == []
    assert hardware_difference(planned, two, flags, need) == ["the plan is for CUDA0; this machine has CUDA0, CUDA1"]


def test_extra_flags_split_and_refused():
    assert _split_extra(("-c", "4096", "--api-key", "k", "--ssl-key-file=x", "-t", "4")) == (
        ["-c", "4096", "-t", "4"], ["--api-key", "k", "--ssl-key-file=x"])
    for owned in (("--port", "9"), ("--host=0.0.0.0",), ("-m", "x.gguf")):
        with pytest.raises(BadInput):
            _split_extra(owned)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_go_to_the_server_pid(signum):
    # the child dies of the signal by default (SIGINT too: not a Python child); a shell that started the tests
    # in the background hands its children SIGINT ignored, so the child's disposition is set to the default
    child = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: signal.signal(signum, signal.SIG_DFL))
    before = signal.getsignal(signum)
    try:
        with forward_signals(child) as received:
            os.kill(os.getpid(), signum)   # to us: forwarded, not fatal
            assert child.wait(timeout=10) == -signum
        assert received == [signum]
        assert signal.getsignal(signum) is before   # restored
    finally:
        if child.poll() is None:
            child.kill()
