"""sd-cli's `--backend` / `--params-backend` / `--max-vram` assignment strings.

Rules follow seed 002 (stable-diffusion.cpp docs/backend.md) and the facts of its parser
(src/core/ggml_extend_backend.cpp `sd_parse_backend_assignment` / `validate`, and
src/core/ggml_graph_cut.cpp `MaxVramAssignment::parse`): comma-separated parts, empty parts
skipped, a part without `=` sets the default, `all=`/`default=`/`*=` set the default, the last
setting for a module wins, an empty key or value is refused, module names are matched
case-insensitively with `-` and `_` ignored.

Parsing is syntax only; `resolve_*` turn tokens into device names against an inventory.
"""
from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass

from planner.core.errors import FlagError
from planner.core.units import quote


class Module(enum.Enum):
    """sd-cli's backend modules (SDBackendModule), valued by their canonical key."""

    DIFFUSION = "diffusion"
    TE = "te"
    CLIP_VISION = "clip_vision"
    VAE = "vae"
    CONTROLNET = "controlnet"
    PHOTOMAKER = "photomaker"
    UPSCALER = "upscaler"
    DETECTOR = "detector"


# Seed 002, "Modules" table: accepted names, compared after lower-casing and dropping - and _.
MODULE_ALIASES: dict[Module, tuple[str, ...]] = {
    Module.DIFFUSION: ("diffusion", "model", "unet", "dit"),
    Module.TE: ("te", "clip", "text", "textencoder", "textencoders", "conditioner", "cond",
                "llm", "t5", "t5xxl"),
    Module.CLIP_VISION: ("clipvision", "vision"),
    Module.VAE: ("vae", "firststage", "autoencoder", "tae"),
    Module.CONTROLNET: ("controlnet", "control"),
    Module.PHOTOMAKER: ("photomaker", "photomakerid", "pmid", "photo"),
    Module.UPSCALER: ("upscaler", "esrgan", "hires"),
    Module.DETECTOR: ("detector", "adetailer", "yolo"),
}
# Seed 002, "Multiple devices per module": "Layer split is supported for the diffusion and te
# modules ... other modules accept only a single device."
SPLITTABLE = frozenset({Module.DIFFUSION, Module.TE})
_ALIAS_TO_MODULE = {alias: module for module, aliases in MODULE_ALIASES.items() for alias in aliases}
ALL_KEY = "all"  # the default key sd-fit writes back into the specs it derives
DEFAULT_KEYS = (ALL_KEY, "default", "*")
# Seed 002 "Backend names": these select the default backend (GPU, then iGPU, then CPU).
DEFAULT_TOKENS = ("", "auto", "default")
DISK = "disk"
CPU = "CPU"


class Role(enum.Enum):
    """Which flag an assignment string came from; the rules differ (seed 002)."""

    BACKEND = "--backend"
    PARAMS = "--params-backend"
    SPLIT_MODE = "--split-mode"


class SplitMode(enum.Enum):
    """`--split-mode` values (seed 002, "Multiple devices per module")."""

    LAYER = "layer"
    ROW = "row"


# sd-cli's compatibility flags and what each prepends to which assignment (seed 002,
# "Compatibility flags"); prepended entries lose to later explicit ones.
COMPAT_FLAGS: dict[str, tuple[Role, str]] = {
    "--clip-on-cpu": (Role.BACKEND, "te=cpu"),
    "--vae-on-cpu": (Role.BACKEND, "vae=cpu"),
    "--control-net-cpu": (Role.BACKEND, "controlnet=cpu"),
    "--offload-to-cpu": (Role.PARAMS, "*=cpu"),
}


@dataclass(frozen=True)
class Assignment:
    """A parsed assignment: a default token and per-module tokens (raw, trimmed)."""

    default: str = ""
    modules: tuple[tuple[Module, str], ...] = ()

    def get(self, module: Module) -> str:
        for m, value in self.modules:
            if m == module:
                return value
        return self.default

    def explicit(self, module: Module) -> bool:
        """True when the module has a non-default token (its own or the default's)."""
        return not is_default_token(self.get(module))

    @property
    def empty(self) -> bool:
        return not self.default and not self.modules


def is_default_token(token: str) -> bool:
    return token.strip().lower() in DEFAULT_TOKENS


def parse_module(raw: str) -> Module | None:
    key = raw.strip().lower().replace("-", "").replace("_", "")
    return _ALIAS_TO_MODULE.get(key)


def split_device_list(token: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in token.split("&") if t.strip())


def _check_split_mode(token: str, flag: str) -> None:
    if token.strip().lower() not in {m.value for m in SplitMode}:
        raise FlagError(f"{flag}: invalid split mode {quote(token.strip())} (expected layer or row)")


def _check_params_token(token: str, flag: str) -> None:
    if "&" in token:
        raise FlagError(f"{flag}: does not accept device lists ({quote(token)}); '&' is only for --backend")


def _check_device_list(token: str, flag: str) -> None:
    """A `&` list: non-empty, and neither a default token nor disk among its names."""
    names = split_device_list(token)
    if not names:
        raise FlagError(f"{flag}: invalid backend device list {quote(token)}")
    for name in names:
        if is_default_token(name):
            raise FlagError(f"{flag}: default backend token {quote(name)} is not allowed in a device list "
                            f"{quote(token)}")
        if name.lower() == DISK:
            raise FlagError(f"{flag}: backend 'disk' is only accepted by --params-backend ({quote(token)})")


def _check_backend_token(token: str, flag: str) -> None:
    if token.strip().lower() == DISK:
        raise FlagError(f"{flag}: backend 'disk' is only accepted by --params-backend "
                        "(it is a parameter residency mode, not a compute backend)")
    if "&" in token:
        _check_device_list(token, flag)


# The per-token rules sd-cli's `validate` applies for each flag, short of looking devices up.
_TOKEN_CHECKS: dict[Role, Callable[[str, str], None]] = {
    Role.BACKEND: _check_backend_token,
    Role.PARAMS: _check_params_token,
    Role.SPLIT_MODE: _check_split_mode,
}


def _check_token(token: str, role: Role, flag: str) -> None:
    _TOKEN_CHECKS[role](token, flag)


def parse_assignment(text: str | None, role: Role) -> Assignment:
    """Parse one `--backend` or `--params-backend` string; raise FlagError naming the token."""
    flag = role.value
    default = ""
    modules: dict[Module, str] = {}
    for raw_part in (text or "").strip().split(","):
        part = raw_part.strip()
        if not part:
            continue
        if "=" not in part:
            _check_token(part, role, flag)
            default = part
            continue
        key, value = (s.strip() for s in part.split("=", 1))
        if not key or not value:
            raise FlagError(f"{flag}: invalid backend assignment {quote(part)} (expected MODULE=BACKEND)")
        _check_token(value, role, flag)
        if key.lower() in DEFAULT_KEYS:
            default = value
            continue
        module = parse_module(key)
        if module is None:
            raise FlagError(f"{flag}: unknown backend module {quote(key)} in {quote(part)}")
        if role is Role.BACKEND and "&" in value and module not in SPLITTABLE:
            raise FlagError(f"{flag}: {quote(part)}: {module.value} cannot be split over devices; layer split is "
                            f"supported for the diffusion and te modules only, other modules accept one device "
                            f"(seed 002, 'Multiple devices per module')")
        modules[module] = value
    return Assignment(default=default, modules=tuple(modules.items()))


def with_compat(text: str | None, role: Role, flags: tuple[str, ...]) -> str | None:
    """`text` with the compatibility flags' entries for `role` prepended, as sd-cli does."""
    for flag in flags:
        if flag not in COMPAT_FLAGS:
            raise FlagError(f"{flag}: not an sd-cli compatibility flag ({', '.join(COMPAT_FLAGS)})")
    prefix = [entry for flag, (r, entry) in COMPAT_FLAGS.items() if flag in flags and r is role]
    return ",".join([*prefix, text]) if prefix and text else (",".join(prefix) or text)


@dataclass(frozen=True)
class MaxVram:
    """A parsed `--max-vram`: GiB values (0 = unset, <0 = free minus that many GiB)."""

    default_gib: float = 0.0
    devices: tuple[tuple[str, float], ...] = ()


def _parse_gib(text: str) -> float:
    try:
        value = float(text) if text.isascii() else math.nan   # float() reads '٨' as 8; sd-cli's stof does not
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise FlagError(f"--max-vram: invalid value {quote(text)} (expected GiB, e.g. 6 or -2)")
    return value


def parse_max_vram(text: str | None) -> MaxVram:
    """Parse `--max-vram` as sd-cli does (MaxVramAssignment::parse): GiB, bare or NAME=GiB."""
    default = 0.0
    devices: dict[str, float] = {}
    for raw_part in (text or "").strip().split(","):
        part = raw_part.strip()
        if not part:
            continue
        if "=" not in part:
            default = _parse_gib(part)
            continue
        key, value = (s.strip() for s in part.split("=", 1))
        if not key or not value:
            raise FlagError(f"--max-vram: invalid assignment {quote(part)} (expected DEVICE=GiB)")
        if key.lower() in DEFAULT_KEYS:
            default = _parse_gib(value)
        else:
            devices[key] = _parse_gib(value)
    return MaxVram(default_gib=default, devices=tuple(devices.items()))
