"""Backend tokens -> device names, against an inventory (seed 002, "Backend names").

`cpu` is the host; `auto`/`default`/empty select the default backend; a backend registry
name (`cuda`, `vulkan`, `metal`) selects that registry's first device (stable-diffusion.cpp
`resolve_first_device_by_registry_name`, which maps `metal` to `MTL`); anything else is a
device name, exact or a unique prefix, case-insensitive, `gpu` being the first GPU — that
part is planner.hardware.budgets.resolve_device, shared with the llama.cpp planner.
"""
from __future__ import annotations

from planner.core.errors import BadInput, FlagError
from planner.core.units import quote
from planner.hardware.budgets import resolve_device
from planner.hardware.inventory import NAME_PREFIX, Backend, DeviceKind, Inventory
from planner.sd.assign import CPU, DISK, Assignment, MaxVram, Module, Role, is_default_token, split_device_list
from planner.sd.sd_placement import Where

# sd-cli treats a 0 GiB budget as unset: free minus 512 MiB.
UNSET_GIB = -0.5
_REGISTRY_ALIASES: dict[str, Backend] = {b.value.lower(): b for b in Backend if b is not Backend.CPU}
_REGISTRY_ALIASES.update({NAME_PREFIX[b].lower(): b for b in NAME_PREFIX})


def resolve_name(inventory: Inventory, token: str, flag: str) -> str:
    """One backend token -> an inventory device name, or CPU."""
    lower = token.strip().lower()
    if lower == "cpu":
        return CPU
    backend = _REGISTRY_ALIASES.get(lower)
    if backend is not None:
        first = next((d for d in inventory.devices if d.backend is backend), None)
        if first is not None:
            return first.name
    try:
        return resolve_device(inventory, token.strip()).name
    except BadInput:
        known = ", ".join([*inventory.names, CPU]) or CPU
        raise FlagError(f"{flag}: backend {quote(token.strip())} was not found (devices: {known})") from None


def default_device(inventory: Inventory) -> str:
    """Seed 002: the default backend is the first GPU, then integrated GPU, then the CPU."""
    for kind in (DeviceKind.GPU, DeviceKind.IGPU):
        dev = next((d for d in inventory.devices if d.kind is kind), None)
        if dev is not None:
            return dev.name
    return CPU


def canonical_token(inventory: Inventory, token: str, role: Role) -> str:
    """A token with each device spelled as the inventory names it (sd-cli validates every
    module's token, including modules sd-fit does not place)."""
    if role is Role.PARAMS and token.strip().lower() == DISK:
        return DISK
    names = [resolve_name(inventory, t, role.value) for t in split_device_list(token)]
    return "&".join("cpu" if n == CPU else n for n in names)


def resolve_compute(inventory: Inventory, assignment: Assignment, module: Module) -> tuple[str, ...] | None:
    """A module's --backend: None (unassigned: auto-fit or the default backend decides),
    () for the CPU, or GPU names (several for a layer split)."""
    token = assignment.get(module)
    if is_default_token(token):
        return None
    names = tuple(resolve_name(inventory, t, Role.BACKEND.value) for t in split_device_list(token))
    if len(names) > 1 and CPU in names:
        raise FlagError(f"--backend: {token!r}: fitplan plans layer splits across GPUs only, not the CPU")
    if len(set(names)) != len(names):
        raise FlagError(f"--backend: {token!r} lists a device twice")
    return () if names == (CPU,) else names


def resolve_params(inventory: Inventory, assignment: Assignment, module: Module) -> tuple[Where, str | None] | None:
    """A module's --params-backend: None when unset (parameters follow the runtime backend)."""
    token = assignment.get(module)
    if not token:
        return None
    if token.strip().lower() == DISK:
        return Where.DISK, None
    # A non-empty default token is not "unset": sd.cpp initialises the default backend for it
    # (SDBackendManager::params_backend only follows the runtime for an empty name).
    name = default_device(inventory) if is_default_token(token) else resolve_name(inventory, token, Role.PARAMS.value)
    return (Where.CPU, None) if name == CPU else (Where.OTHER_GPU, name)


def canonical_max_vram(inventory: Inventory, max_vram: MaxVram) -> str | None:
    """--max-vram in planner.hardware.budgets' syntax, every key resolved to its device name.

    sd-cli's rules (backend_fit.cpp `enumerate_gpu_devices`): a device's own value replaces
    the default; 0 means unset, i.e. free minus 512 MiB — written here as -0.5 so that a
    device's explicit 0 still overrides a bare default. A key naming no device is refused
    (`canonicalize_backend_keys`); a CPU key budgets nothing.
    """
    parts = [repr(max_vram.default_gib)] if max_vram.default_gib else []
    for key, gib in max_vram.devices:
        try:
            name = resolve_name(inventory, key, "--max-vram")
        except FlagError:
            known = ", ".join(inventory.names) or "none"
            raise FlagError(f"--max-vram: unknown backend {quote(key)} (devices: {known})") from None
        if name != CPU:
            parts.append(f"{name}={gib if gib else UNSET_GIB!r}")
    return ",".join(parts) or None
