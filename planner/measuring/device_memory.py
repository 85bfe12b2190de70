"""What a GPU holds after llama-server loaded a plan, read from the driver's own tool: `serve` measures each
local GPU before the load and once it answers, and compares the growth with the plan's rows plus their
overhead (planner/llama/overhead.py), and what is left free with the device margin.

Sources, each parsed from its text (tests feed recorded outputs):
- NVIDIA: `nvidia-smi --query-gpu=index,pci.bus_id,memory.total,memory.used,memory.free
  --format=csv,noheader,nounits` (MiB);
- AMD: `rocm-smi --showmeminfo vram --json` ("VRAM Total Memory (B)", "VRAM Total Used Memory (B)" per card).

A CUDA device is matched to nvidia-smi's row by the PCI bus id its inventory states, else by index (llama.cpp
numbers CUDA devices as the CUDA runtime orders them; nvidia-smi by PCI bus: set CUDA_DEVICE_ORDER=PCI_BUS_ID
for the two to agree on a machine with unlike cards). ROCm devices are matched by index.
"""
from __future__ import annotations

import json
import logging
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from planner.core.units import MiB, fmt_mib
from runtime.ggml.profiles import Backend

log = logging.getLogger(__name__)

NVIDIA_SMI_QUERY = ["--query-gpu=index,pci.bus_id,memory.total,memory.used,memory.free",
                    "--format=csv,noheader,nounits"]
ROCM_SMI_QUERY = ["--showmeminfo", "vram", "--json"]
ROCM_TOTAL, ROCM_USED = "VRAM Total Memory (B)", "VRAM Total Used Memory (B)"


@dataclass(frozen=True)
class GpuMemory:
    """One GPU as its driver's tool reports it, bytes."""

    backend: Backend
    index: int
    total_bytes: int
    used_bytes: int
    bus_id: str = ""

    @property
    def free_bytes(self) -> int:
        return self.total_bytes - self.used_bytes


def parse_nvidia_smi_memory(text: str) -> list[GpuMemory]:
    """Rows of nvidia-smi's query (NVIDIA_SMI_QUERY); lines it cannot read are skipped."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        try:
            index, total, used = int(parts[0]), int(parts[2]), int(parts[3])
        except ValueError:
            log.debug("nvidia-smi: cannot read %r", line)
            continue
        out.append(GpuMemory(Backend.CUDA, index, total * MiB, used * MiB, parts[1].lower()))
    return out


def parse_rocm_smi_memory(text: str) -> list[GpuMemory]:
    """Cards of `rocm-smi --showmeminfo vram --json`, in card order."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return []
    out = []
    cards = sorted((k for k in doc if k.startswith("card") and k[4:].isdigit()), key=lambda k: int(k[4:]))
    for card in cards:
        info = doc[card]
        try:
            out.append(GpuMemory(Backend.ROCM, int(card[4:]), int(info[ROCM_TOTAL]), int(info[ROCM_USED])))
        except (KeyError, ValueError, TypeError):
            log.debug("rocm-smi: cannot read %s: %r", card, info)
    return out


def _run(exe: str, args: list[str]) -> str | None:
    path = shutil.which(exe)
    if path is None:
        return None
    try:
        return subprocess.run([path, *args], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("%s: %s", exe, exc)
        return None


def measure_gpus() -> list[GpuMemory]:
    """Every GPU nvidia-smi and rocm-smi report on this machine ([] without either)."""
    nvidia = _run("nvidia-smi", NVIDIA_SMI_QUERY)
    rocm = _run("rocm-smi", ROCM_SMI_QUERY)
    return (parse_nvidia_smi_memory(nvidia) if nvidia else []) + (parse_rocm_smi_memory(rocm) if rocm else [])


@dataclass(frozen=True)
class PlannedDevice:
    """A local GPU of the plan: its llama.cpp name, backend, PCI bus id when known, and what the plan puts on it."""

    name: str
    backend: Backend
    planned_bytes: int          # model + context + compute (the estimate's row)
    overhead_bytes: int         # held outside the breakdown
    bus_id: str = ""


def match(device: PlannedDevice, gpus: list[GpuMemory]) -> GpuMemory | None:
    """The driver's row for a plan's device: by PCI bus id when known, else the index in the device's name."""
    same = [g for g in gpus if g.backend is device.backend]
    if device.bus_id:
        return next((g for g in same if g.bus_id.endswith(device.bus_id.lower())), None)
    digits = device.name[len(device.backend.value):]
    return next((g for g in same if digits.isdigit() and g.index == int(digits)), None)


def after_load_notes(devices: list[PlannedDevice], before: list[GpuMemory], after: list[GpuMemory],
                     margin: int, slack: int) -> list[str]:
    """One line per measured device: its growth beside the plan's rows plus overhead, and what is free; a
    warning line when less than `margin` is left, or when it grew more than planned by over `slack`."""
    out = []
    for dev in devices:
        now, then = match(dev, after), match(dev, before)
        if now is None:
            continue
        line = (f"{dev.name} after load: {fmt_mib(now.used_bytes)} MiB used of {fmt_mib(now.total_bytes)} MiB, "
                f"{fmt_mib(now.free_bytes)} MiB free")
        expected = dev.planned_bytes + dev.overhead_bytes
        if then is not None:
            grew = now.used_bytes - then.used_bytes
            line += (f"; grew {fmt_mib(grew)} MiB, the plan's rows and overhead {fmt_mib(expected)} MiB "
                     f"({fmt_mib(dev.planned_bytes)} + {fmt_mib(dev.overhead_bytes)})")
            if grew > expected + slack:
                line += f" — warning: {fmt_mib(grew - expected)} MiB more than planned"
        if now.free_bytes < margin:
            line += (f" — warning: less than the {fmt_mib(margin)} MiB margin is left free; another process on the "
                     f"card, or a longer prompt growing the memory pool, can make it fail to allocate")
        out.append(line)
    return out


def planned_devices(names: tuple[str, ...], backends: Mapping[str, Backend], rows: Mapping[str, tuple[int, int, int]],
                    overheads: Mapping[str, int], bus_ids: Mapping[str, str]) -> list[PlannedDevice]:
    """The plan's local CUDA and ROCm devices, as after_load_notes compares them."""
    return [PlannedDevice(n, backends[n], sum(rows.get(n, (0, 0, 0))), overheads.get(n, 0), bus_ids.get(n, ""))
            for n in names if backends.get(n) in (Backend.CUDA, Backend.ROCM)]
