"""Detect this machine's inventory: host RAM and CPU, NVIDIA and AMD GPUs, and — when the
llama.cpp tools are built — llama.cpp's own device list, which is the authority on names
and order. Finding only the CPU is a normal result.

Every probe is best-effort: a missing driver or tool logs at debug level and yields nothing.
"""
from __future__ import annotations

import logging
import re
import shutil
import socket
import subprocess
from dataclasses import replace
from pathlib import Path

import psutil

from planner.core.errors import InventoryError
from planner.core.units import GiB, MiB
from planner.hardware import catalog
from planner.hardware.inventory import (
    NAME_PREFIX,
    Backend,
    DeviceKind,
    DeviceSpec,
    HostSpec,
    Inventory,
    backend_of_name,
    check_endpoint,
    llama_order,
    pcie_link_bytes_s,
)
from planner.hardware.local_servers import listening_pids, rpc_server_cpus
from planner.system import llama_tools

log = logging.getLogger(__name__)

# An amdgpu VRAM carve-out this small belongs to an APU: its usable memory is the GTT aperture
# onto system RAM (seed 003 §7: compare mem_info_vram_total with mem_info_gtt_total).
APU_CARVEOUT_MAX = 4 * GiB
AMD_PCI_VENDOR = "0x1002"   # the PCI vendor id sysfs reports in device/vendor (PCI-SIG's list)
# common_print_available_devices (common/arg.cpp): "  NAME: DESCRIPTION (TOTAL MiB, FREE MiB free)"
_LIST_LINE = re.compile(r"^\s+(\S+): (.*) \((\d+) MiB, (\d+) MiB free\)\s*$")
_TIMEOUT_S = 60
_CONNECT_TIMEOUT_S = 5


def parse_cpu_model(text: str) -> str:
    """The CPU model from /proc/cpuinfo ('model name' on x86, 'Model'/'Hardware' on ARM)."""
    for key in ("model name", "Model", "Hardware", "cpu model"):
        m = re.search(rf"^{key}\s*:\s*(.+)$", text, re.MULTILINE)
        if m:
            return m.group(1).strip()
    return ""


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def detect_host(proc: str | Path = "/proc") -> HostSpec:
    """Host RAM from psutil (total, and available as the kernel estimates it: MemAvailable on
    Linux); the CPU model from `proc`/cpuinfo."""
    memory = psutil.virtual_memory()
    return HostSpec(memory.total, memory.available, 0, parse_cpu_model(_read(Path(proc) / "cpuinfo")))


def _catalog_facts(dev: DeviceSpec) -> DeviceSpec:
    """Fill what a driver cannot report (bandwidth, fp16, host link) from the catalog."""
    known = catalog.match_description(dev.description) if dev.description else None
    if known is None:
        return dev
    return replace(
        dev,
        bandwidth_bytes_s=dev.bandwidth_bytes_s or known.bandwidth_bytes_s,
        fp16_flops=dev.fp16_flops or known.fp16_flops,
        link_bytes_s=dev.link_bytes_s or known.link_bytes_s,
        uma=dev.uma or known.uma,
        stream_bytes_s=dev.stream_bytes_s or known.stream_bytes_s,
        kernel_seconds=dev.kernel_seconds or known.kernel_seconds,
        kind=DeviceKind.IGPU if known.kind is DeviceKind.IGPU and dev.kind is DeviceKind.GPU else dev.kind,
    )


def _nvidia_device(index: int, description: str, total: int, free: int, gen: int, width: int) -> DeviceSpec:
    try:
        link = pcie_link_bytes_s(gen, width)
    except ValueError:
        link = 0
    name = f"{NAME_PREFIX[Backend.CUDA]}{index}"
    return DeviceSpec(name, DeviceKind.GPU, Backend.CUDA, total, free, 0, 0, link, description=description)


def detect_nvidia_nvml() -> list[DeviceSpec] | None:
    """NVIDIA GPUs through NVML (nvidia-ml-py, optional); None when NVML is unavailable."""
    try:
        import pynvml  # optional (the `nvidia` extra): imported here so that detection works without it

        pynvml.nvmlInit()
    except Exception as exc:  # ImportError, or NVMLError when no driver is loaded
        log.debug("NVML unavailable: %s", exc)
        return None
    try:
        out: list[DeviceSpec] = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            gen = pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h)
            width = pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)
            text = name.decode() if isinstance(name, bytes) else name
            out.append(_nvidia_device(i, text, mem.total, mem.free, gen, width))
        return out
    finally:
        pynvml.nvmlShutdown()


def parse_nvidia_smi(text: str) -> list[DeviceSpec]:
    """Rows of `nvidia-smi --query-gpu=name,memory.total,memory.free,pcie.link.gen.max,
    pcie.link.width.max --format=csv,noheader,nounits` (memory in MiB)."""
    out: list[DeviceSpec] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        name, total, free, gen, width = parts
        try:
            out.append(_nvidia_device(len(out), name, int(total) * MiB, int(free) * MiB,
                                      int(gen) if gen.isdigit() else 0, int(width) if width.isdigit() else 0))
        except ValueError:
            log.debug("nvidia-smi: cannot read %r", line)
    return out


def detect_nvidia_smi() -> list[DeviceSpec]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    query = "name,memory.total,memory.free,pcie.link.gen.max,pcie.link.width.max"
    try:
        done = subprocess.run([exe, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("nvidia-smi failed: %s", exc)
        return []
    return parse_nvidia_smi(done.stdout) if done.returncode == 0 else []


def detect_amd(drm: str | Path = "/sys/class/drm") -> list[DeviceSpec]:
    """AMD GPUs from amdgpu's sysfs files. A small VRAM carve-out next to a GTT window means an
    APU: its memory is system RAM (UMA) and its usable size is the GTT window."""
    out: list[DeviceSpec] = []
    for card in sorted(Path(drm).glob("card[0-9]*"), key=lambda p: int(re.sub(r"\D", "", p.name) or 0)):
        dev = card / "device"
        if not re.fullmatch(r"card\d+", card.name) or _read(dev / "vendor").strip() != AMD_PCI_VENDOR:
            continue
        try:
            vram = int(_read(dev / "mem_info_vram_total"))
            used = int(_read(dev / "mem_info_vram_used") or 0)
            gtt = int(_read(dev / "mem_info_gtt_total") or 0)
        except ValueError:
            continue
        uma = vram <= APU_CARVEOUT_MAX and gtt > vram
        total = gtt if uma else vram
        free = total - (int(_read(dev / "mem_info_gtt_used") or 0) if uma else used)
        description = _read(dev / "product_name").strip() or "AMD Radeon GPU"
        kind = DeviceKind.IGPU if uma else DeviceKind.GPU
        name = f"{NAME_PREFIX[Backend.ROCM]}{len(out)}"
        out.append(DeviceSpec(name, kind, Backend.ROCM, total, max(0, free), 0, 0, 0, uma=uma, description=description))
    return out


def parse_list_devices(text: str) -> list[DeviceSpec]:
    """Devices from `llama-cli --list-devices` output, in the order it prints them."""
    out = []
    for line in text.splitlines():
        m = _LIST_LINE.match(line)
        if not m:
            continue
        name, desc, total, free = m.group(1), m.group(2).strip(), int(m.group(3)) * MiB, int(m.group(4)) * MiB
        parsed = backend_of_name(name)
        backend = parsed[0] if parsed else None
        if backend is None or backend is Backend.CPU:
            log.debug("llama-cli lists %s (%s) of an unknown backend; skipped", name, desc)
            continue
        if backend is Backend.RPC:
            out.append(DeviceSpec(name, DeviceKind.RPC, Backend.RPC, total, free, 0, 0, 0, endpoint=desc,
                                  description=desc))
        else:
            out.append(DeviceSpec(name, DeviceKind.GPU, backend, total, free, 0, 0, 0, description=desc))
    return out


def list_llama_devices(bin_dir: Path, rpc: list[str]) -> list[DeviceSpec]:
    """Ask llama.cpp itself. `--rpc` must precede `--list-devices`: llama.cpp handles options in
    order and --list-devices prints and exits as soon as it is parsed (common/arg.cpp)."""
    args = [str(bin_dir / "llama-cli")] + (["--rpc", ",".join(rpc)] if rpc else []) + ["--list-devices"]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InventoryError(f"llama-cli --list-devices failed: {exc}; expected it to list devices") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["no output"]
        # ggml aborts with "<source>:<line>: <message>" followed by a debugger backtrace.
        last = next((ln.split(": ", 1)[-1] for ln in lines if re.search(r"error|failed", ln, re.IGNORECASE)), lines[-1])
        raise InventoryError(f"llama-cli --list-devices exited with {done.returncode} ({last}); expected a device list")
    return parse_list_devices(done.stdout)


def _check_reachable(endpoint: str) -> None:
    """Refuse an endpoint nothing listens on before llama-cli aborts on it."""
    host, port = endpoint.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_CONNECT_TIMEOUT_S):
            return
    except OSError as exc:
        reason = exc.strerror or exc
        raise InventoryError(f"--rpc {endpoint}: cannot connect ({reason}); expected a running rpc-server") from None


def detect_inventory(rpc: list[str] | None = None, use_llama: bool = True) -> Inventory:
    """This machine's inventory. With the llama.cpp tools built, their device list decides names
    and order; otherwise NVML / nvidia-smi and amdgpu sysfs do. `rpc` endpoints need the tools."""
    rpc = list(rpc or [])
    for ep in rpc:
        if check_endpoint(ep) is None:
            raise InventoryError(f"--rpc {ep!r}: expected host:port")
        _check_reachable(ep)
    bin_dir = llama_tools.tools_dir() if use_llama else None
    if rpc and not use_llama:
        raise InventoryError("--rpc: expected llama-cli to list the RPC devices; drop --no-llama")
    if rpc and bin_dir is None:
        raise InventoryError("--rpc: the llama.cpp tools are not built; expected them from scripts/build_llama_cpp.sh")
    devices = None
    if bin_dir is not None:
        try:
            devices = list_llama_devices(bin_dir, rpc)
        except InventoryError as exc:
            if rpc:
                raise
            log.warning("%s; using the drivers' device lists instead", exc)
    if devices is None:
        nvml = detect_nvidia_nvml()
        devices = (nvml if nvml is not None else detect_nvidia_smi()) + detect_amd()
    devices = _local_cpus([_catalog_facts(d) for d in devices])
    return Inventory(llama_order(devices), detect_host(), source="detected")


def _local_cpus(devices: list[DeviceSpec]) -> list[DeviceSpec]:
    """RPC devices served on this machine's loopback, with the CPUs and threads their rpc-servers compute
    with (the system's sockets scanned once, only when there are RPC devices)."""
    if not any(d.kind is DeviceKind.RPC and d.endpoint for d in devices):
        return devices
    pids = listening_pids()
    out = []
    for dev in devices:
        found = rpc_server_cpus(dev.endpoint, pids) if dev.kind is DeviceKind.RPC and dev.endpoint else None
        out.append(dev if found is None else replace(dev, cpus=found.cpus, threads=found.threads))
    return out
