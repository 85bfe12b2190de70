"""Per-device memory budgets with stable-diffusion.cpp's `--max-vram` semantics (seed 002).

`--max-vram` is a comma-separated list of `NAME=N` items and at most one bare `N`:
  NAME=N   caps that device at min(N, free); N is GiB unless it has a unit (512MiB, 1.5GiB)
  NAME=-N  free minus N
  N        the same rule for every device without its own item
  (unset)  free minus 512 MiB
A Metal device's free memory is capped at macOS's GPU working set first (planner/hardware/apple.py). The default
margin is left beyond the memory a process holds outside llama.cpp's breakdown, which plans count in each device
row (planner/llama/overhead.py; docs/internals/gpu-overhead.md says why 512 MiB stays).
The host RAM budget is available RAM minus max(2 GiB, 10 % of available) unless given (seed
002: "reserving the larger of 2 GiB or 10% of available RAM for other work"); a given value
follows the same positive/negative rules against available RAM.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

from planner.core.errors import BadInput, InventoryError
from planner.core.units import SIZE_TEXT, GiB, MiB, fmt_mib, parse_size, quote
from planner.hardware.apple import read_wired_limit, working_set
from planner.hardware.inventory import HOST, LOCAL_GPU_KINDS, DeviceSpec, Inventory

log = logging.getLogger(__name__)

# seed 002: "free memory minus a 512 MiB margin"; left beyond each row's overhead (planner/llama/overhead.py)
DEFAULT_DEVICE_MARGIN = 512 * MiB
HOST_RESERVE_MIN = 2 * GiB          # seed 002: "the larger of 2 GiB or 10% of available RAM"
HOST_RESERVE_FRACTION = 0.10
GPU_ALIAS = "gpu"                   # names the first local GPU in llama.cpp order


@dataclass(frozen=True)
class Budgets:
    """Bytes a plan may use: per device (llama.cpp names) and on the host.

    `uma_pool_bytes`, when set, caps Host plus every UMA device together: their memory is
    the same system RAM (seed 003 §7), so it must not be counted twice.
    """

    devices: dict[str, int]
    host_bytes: int
    uma_pool_bytes: int | None = None
    pool_devices: tuple[str, ...] = ()   # the UMA devices in that pool, beside Host

    def over(self, totals: Mapping[str, int]) -> dict[str, int]:
        """Bytes over budget per row of `totals` (device names, and Host with every host row
        summed); what Host and the UMA devices use together beyond the pool is charged to Host,
        whose budget the pool is."""
        out = {name: n - self.devices[name] for name, n in totals.items()
               if name in self.devices and n > self.devices[name]}
        host = totals.get(HOST, 0)
        if HOST in totals and host > self.host_bytes:
            out[HOST] = host - self.host_bytes
        excess = self.pool_excess(totals)
        if excess:
            out[HOST] = max(out.get(HOST, 0), excess)
        return out

    def pool_excess(self, totals: Mapping[str, int]) -> int:
        """Bytes Host and the UMA devices use together beyond their shared pool (0 without one)."""
        if self.uma_pool_bytes is None:
            return 0
        return max(0, self.pooled(totals) - self.uma_pool_bytes)

    def pooled(self, totals: Mapping[str, int]) -> int:
        """Bytes Host and the UMA devices use together (what the pool must hold)."""
        return totals.get(HOST, 0) + sum(totals.get(name, 0) for name in self.pool_devices)

    def rows(self) -> dict[str, int]:
        """The budgets by row: each device's under its name, the host's under HOST."""
        return {**self.devices, HOST: self.host_bytes}

    @classmethod
    def from_rows(cls, rows: Mapping[str, int], uma_pool_bytes: int | None = None,
                  pool_devices: tuple[str, ...] = ()) -> Budgets:
        """Budgets from `rows()` and the pool; a missing HOST row is a host budget of 0 (judge such
        budgets only on the rows they have: `over_verdict`)."""
        return cls({k: v for k, v in rows.items() if k != HOST}, rows.get(HOST, 0), uma_pool_bytes, pool_devices)


def pool_members(budgets: Budgets) -> list[str]:
    """Host and the UMA devices that share its RAM ([] when no device does)."""
    return [HOST, *budgets.pool_devices] if budgets.uma_pool_bytes is not None else []


def pool_name(budgets: Budgets) -> str:
    """The pool's members in words: "Host and Vulkan0", "Host, Vulkan0 and Vulkan1"."""
    members = pool_members(budgets)
    return ", ".join(members[:-1]) + " and " + members[-1] if len(members) > 1 else "".join(members)


def over_verdict(budgets: Budgets, totals: Mapping[str, int]) -> str | None:
    """"does not fit on X by N MiB" for the row most over its budget, or "does not fit in the N MiB
    pool Host and Vulkan0 share by M MiB" when the shared pool is what overflows most; None when
    `totals` fit. Rows of `totals` without a budget are not judged."""
    over = budgets.over(totals)
    if not over:
        return None
    name, by = max(over.items(), key=lambda x: x[1])
    own = totals.get(HOST, 0) - budgets.host_bytes
    if name == HOST and budgets.uma_pool_bytes is not None and by == budgets.pool_excess(totals) and by > own:
        return (f"does not fit in the {fmt_mib(budgets.uma_pool_bytes)} MiB pool {pool_name(budgets)} share "
                f"by {fmt_mib(by)} MiB")
    return f"does not fit on {name} by {fmt_mib(by)} MiB"


def resolve_device(inventory: Inventory, name: str) -> DeviceSpec:
    """Find a device by case-insensitive exact name, `gpu` (the first local GPU), or a unique prefix."""
    wanted = name.strip().lower()
    if not wanted:
        raise InventoryError(f"missing device name; expected one of {_choices(inventory)}")
    exact = [d for d in inventory.devices if d.name.lower() == wanted]
    if exact:
        return exact[0]
    if wanted == GPU_ALIAS:
        local = [d for d in inventory.devices if d.kind in LOCAL_GPU_KINDS]
        if not local:
            raise InventoryError(f"no GPU for {quote(name)}: the inventory has {_choices(inventory, alias=False)}")
        return local[0]
    prefixed = [d for d in inventory.devices if d.name.lower().startswith(wanted)]
    if len(prefixed) == 1:
        return prefixed[0]
    if prefixed:
        could_be = ", ".join(d.name for d in prefixed)
        raise InventoryError(f"device {quote(name)} is ambiguous: it could be {could_be}; expected one name")
    raise InventoryError(f"no device {quote(name)}: expected one of {_choices(inventory)}")


def _choices(inventory: Inventory, alias: bool = True) -> str:
    names = inventory.names
    if not names:
        return "no devices (only the CPU)"
    return ", ".join(names + ([GPU_ALIAS] if alias else []))


def _amount(text: str, context: str) -> int:
    """A signed budget amount: bare numbers are GiB, units allowed."""
    if not SIZE_TEXT.match(text):
        raise InventoryError(
            f"{context}: expected a number of GiB (6, -2) or a size with a unit (512MiB, 1.5GiB); got {quote(text)}")
    try:
        return parse_size(text)
    except BadInput as exc:
        raise InventoryError(f"{context}: {exc}") from None


def apply_limit(free: int, amount: int | None, margin: int) -> int:
    """min(amount, free) for amount >= 0; free - |amount| for amount < 0; free - margin if unset.
    Never below zero."""
    if amount is None:
        budget = free - margin
    elif amount < 0:
        budget = free + amount
    else:
        budget = min(amount, free)
    return max(0, budget)


def parse_max_vram(inventory: Inventory, max_vram: str | None) -> dict[str, int]:
    """Device name -> signed amount (bytes) for every device `max_vram` sets."""
    if max_vram is None:
        return {}
    if not max_vram.strip():
        # an empty value is a mistake (an unset shell variable), not "no budget": refuse it
        raise InventoryError(f"--max-vram {quote(max_vram)}: empty; expected SIZE (6, -2, 512MiB) or NAME=SIZE,...")
    per_device: dict[str, int] = {}
    default: int | None = None
    for raw in max_vram.split(","):
        item = raw.strip()
        context = f"--max-vram {quote(item)}"
        if not item:
            raise InventoryError(f"--max-vram {quote(max_vram)}: empty item; expected NAME=SIZE or SIZE "
                                 f"separated by commas")
        if "=" in item:
            _add_device_item(inventory, item, context, per_device)
        elif default is not None:
            raise InventoryError(f"{context}: a second bare value; expected at most one value for all devices")
        else:
            default = _amount(item, context)
    if default is not None:
        for dev in inventory.devices:
            per_device.setdefault(dev.name, default)
    return per_device


def _add_device_item(inventory: Inventory, item: str, context: str, per_device: dict[str, int]) -> None:
    """Record one `NAME=N` item under the device it names, once per device."""
    name, value = (part.strip() for part in item.split("=", 1))
    if not name:
        raise InventoryError(f"{context}: missing device name before '='; expected NAME=SIZE such as CUDA0=6")
    try:
        dev = resolve_device(inventory, name)
    except InventoryError as exc:
        raise InventoryError(f"{context}: {exc}") from None
    if dev.name in per_device:
        raise InventoryError(f"{context}: {dev.name} is set twice; expected one item per device")
    per_device[dev.name] = _amount(value, context)


def host_budget(available: int, ram: str | None) -> int:
    reserve = max(HOST_RESERVE_MIN, int(available * HOST_RESERVE_FRACTION))
    amount = None if ram is None else _amount(ram, f"--max-ram {quote(ram)}")
    return apply_limit(available, amount, reserve)


def metal_free(inventory: Inventory) -> dict[str, int]:
    """Free memory of each Metal device capped at its GPU working set (planner/hardware/apple.py): on this Mac
    the wired-limit sysctl when set, else macOS's default share."""
    wired = read_wired_limit() if inventory.source == "detected" else None
    out = {}
    for d in inventory.devices:
        ws = working_set(d, wired)
        if ws is not None:
            out[d.name] = min(d.free_bytes, ws.bytes)
    return out


def resolve_budgets(inventory: Inventory, max_vram: str | None = None, ram: str | None = None) -> Budgets:
    amounts = parse_max_vram(inventory, max_vram)
    free = {d.name: d.free_bytes for d in inventory.devices} | metal_free(inventory)
    devices = {d.name: apply_limit(free[d.name], amounts.get(d.name), DEFAULT_DEVICE_MARGIN) for d in inventory.devices}
    for name, budget in devices.items():
        if budget == 0:
            log.warning("device %s has a budget of 0 bytes: nothing will be placed on it", name)
    host = host_budget(inventory.host.ram_available_bytes, ram)
    if not any(d.uma for d in inventory.devices):
        return Budgets(devices=devices, host_bytes=host)
    # A UMA device's memory is the host's RAM (seed 003 §7): no budget of it exceeds the
    # host's, and Host plus UMA devices together share that one pool. Its size is the host's
    # budget: llama.cpp's own view of an APU's free memory is that RAM too (ggml-vulkan.cpp,
    # ggml_backend_vk_get_device_memory: an integrated GPU counts every heap, system RAM included,
    # at budget minus usage — what the CPU device reports free as well).
    for dev in inventory.devices:
        if dev.uma:
            devices[dev.name] = min(devices[dev.name], host)
    shared = tuple(d.name for d in inventory.devices if d.uma)
    return Budgets(devices=devices, host_bytes=host, uma_pool_bytes=host, pool_devices=shared)


def fit_target_margins(inventory: Inventory, budgets: Budgets) -> list[int]:
    """Bytes llama.cpp's --fit should leave free on each device (llama.cpp order) so that it
    uses no more than the budget: free - budget (a Metal device's free memory as llama.cpp reports it: the
    working set)."""
    free = {d.name: d.free_bytes for d in inventory.devices} | metal_free(inventory)
    return [max(0, free[d.name] - budgets.devices[d.name]) for d in inventory.devices]


def fit_target_flag(margins: list[int]) -> list[str]:
    """`--fit-target` arguments: whole MiB per device, comma-separated in device order
    (common/arg.cpp parses each value with stoull and multiplies by MiB). Rounded up, so
    llama.cpp leaves at least the margin free."""
    if not margins:
        return []
    return ["--fit-target", ",".join(str(math.ceil(m / MiB)) for m in margins)]
