"""Apple silicon's Metal budget: the GPU working set, not the whole unified memory.

ggml-metal reports a Metal device's memory as the device's `recommendedMaxWorkingSetSize` (ggml-metal-device.m:
the device's free and total memory are that figure), a share of RAM the kernel lets the GPU wire. macOS's
default share is two thirds of RAM up to 32 GiB and three quarters above (the figures ggml-metal prints as
`recommendedMaxWorkingSetSize` on 16, 32, 36, 64 and 192 GiB machines: 10923, 21845, 27648, 49152 and 147456
MiB); `sudo sysctl iogpu.wired_limit_mb=N` raises it to N MiB until the next boot. A catalog Metal device's
memory is its RAM size, so its budget is capped here at the working set; a device llama.cpp listed reports
the working set already, and the cap changes nothing.
"""
from __future__ import annotations

import logging
import platform
import shutil
import subprocess
from dataclasses import dataclass

from planner.core.units import GiB, MiB
from planner.hardware.inventory import DeviceSpec
from runtime.ggml.profiles import Backend

log = logging.getLogger(__name__)

SMALL_RAM = 32 * GiB          # up to this much RAM the default share is two thirds, above it three quarters
WIRED_LIMIT_SYSCTL = "iogpu.wired_limit_mb"


@dataclass(frozen=True)
class WorkingSet:
    bytes: int
    source: str


def default_working_set(ram_bytes: int) -> int:
    """macOS's default GPU working set for a machine of `ram_bytes` (assumed rule, see the module docstring)."""
    return ram_bytes * 2 // 3 if ram_bytes <= SMALL_RAM else ram_bytes * 3 // 4


def working_set(device: DeviceSpec, wired_limit_mb: int | None = None) -> WorkingSet | None:
    """The Metal budget ceiling of a device (None for any other backend): the wired limit when set (0 means
    unset, as macOS reads it), else the default share of the device's memory."""
    if device.backend is not Backend.METAL or not device.total_bytes:
        return None
    if wired_limit_mb:
        return WorkingSet(wired_limit_mb * MiB, f"sysctl {WIRED_LIMIT_SYSCTL}={wired_limit_mb}")
    share = "two thirds" if device.total_bytes <= SMALL_RAM else "three quarters"
    return WorkingSet(default_working_set(device.total_bytes),
                      f"macOS's default GPU working set, {share} of {device.total_bytes // GiB} GiB (assumed; "
                      f"ggml-metal's recommendedMaxWorkingSetSize)")


def read_wired_limit() -> int | None:
    """This Mac's iogpu.wired_limit_mb (None elsewhere, or when unset: 0)."""
    if platform.system() != "Darwin" or shutil.which("sysctl") is None:
        return None
    try:
        out = subprocess.run(["sysctl", "-n", WIRED_LIMIT_SYSCTL], capture_output=True, text=True, timeout=10,
                             check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return int(out) if out.isdigit() and int(out) > 0 else None


def raise_advice(device: DeviceSpec, need_bytes: int) -> str:
    """What to run when the working set is what binds: the limit that would hold `need_bytes` beyond the
    default (leaving the host 8 GiB or a quarter of RAM, whichever is less, as a floor)."""
    host_floor = min(8 * GiB, device.total_bytes // 4)
    limit = min(need_bytes, device.total_bytes - host_floor)
    return (f"{device.name}'s budget is macOS's GPU working set; `sudo sysctl {WIRED_LIMIT_SYSCTL}="
            f"{-(-limit // MiB)}` raises it (until reboot), leaving the rest of RAM to the system")
