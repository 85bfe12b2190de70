"""`--flash-attn` and `--conv-direct`: mode strings and the per-module decisions of seed 002.

Syntax (seed 002, "Flash attention" / "Direct convolution"): a bare mode or `all=`/`default=`/`*=`
sets the default, `MODULE=MODE` sets one module (the aliases of --backend); module settings win
regardless of position, the last setting for the same key wins. Modes: on, off, auto (the default).
Flash attention configures diffusion, te, clip_vision, vae, controlnet and audio_encoder; direct
convolution diffusion, vae and controlnet; other modules are rejected.

`auto` is decided per compute backend:
- flash attention: on for the CPU and CUDA (seed: "enables CPU and supported CUDA MMA
  configurations without timing"; sd-fit cannot see the compiled CUDA architectures and takes a
  CUDA device as supported), on for a Vulkan device whose description names NVIDIA RTX hardware
  (GeForce RTX, TITAN RTX, Quadro RTX, professional RTX); every other device is benchmarked at
  start-up, which a planner cannot run: sd-fit takes `off`, the choice that needs more memory.
- direct convolution: on for CUDA (implicit GEMM on Turing or newer, taken as present) and MUSA;
  Vulkan and HIP are benchmarked or architecture-dependent: taken as off; other backends off.
A module on several devices gets `on` only if every one of them selects on.

The legacy flags map as the seed says: `--fa` is `on`, `--diffusion-fa` is `off,diffusion=on`,
`--diffusion-conv-direct` is `auto,diffusion=on,controlnet=on`, `--vae-conv-direct` is
`auto,vae=on`; an explicit `--flash-attn` / `--conv-direct` takes precedence over them.
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from planner.core.errors import FlagError
from planner.core.units import quote
from planner.sd.assign import CPU, DEFAULT_KEYS, Module, parse_module

AUDIO_ENCODER = "audio_encoder"   # a module of the seed's --flash-attn list that sd-fit never places


class Switch(enum.Enum):
    ON = "on"
    OFF = "off"
    AUTO = "auto"


class Feature(enum.Enum):
    FLASH_ATTN = "--flash-attn"
    CONV_DIRECT = "--conv-direct"

    @property
    def modules(self) -> frozenset[str]:
        if self is Feature.FLASH_ATTN:
            return frozenset({Module.DIFFUSION.value, Module.TE.value, Module.CLIP_VISION.value, Module.VAE.value,
                              Module.CONTROLNET.value, AUDIO_ENCODER})
        return frozenset({Module.DIFFUSION.value, Module.VAE.value, Module.CONTROLNET.value})


@dataclass(frozen=True)
class ModeSpec:
    feature: Feature
    default: Switch = Switch.AUTO
    modules: tuple[tuple[str, Switch], ...] = ()

    def of(self, module: str) -> Switch:
        return dict(self.modules).get(module, self.default)

    @property
    def text(self) -> str:
        parts = [self.default.value] + [f"{m}={s.value}" for m, s in self.modules]
        return ",".join(parts)


def _switch(token: str, feature: Feature, part: str) -> Switch:
    try:
        return Switch(token.strip().lower())
    except ValueError:
        raise FlagError(f"{feature.value}: invalid mode {quote(token.strip())} in {quote(part)} "
                        f"(expected on, off or auto)") from None


def _module_key(key: str, feature: Feature, part: str) -> str:
    norm = key.strip().lower().replace("-", "").replace("_", "")
    module = parse_module(key)
    name = module.value if module is not None else (AUDIO_ENCODER if norm in ("audioencoder", "audio") else None)
    if name is None:
        raise FlagError(f"{feature.value}: unknown module {quote(key.strip())} in {quote(part)}")
    if name not in feature.modules:
        raise FlagError(f"{feature.value}: module {name} has no {feature.value} setting (accepted: "
                        f"{', '.join(sorted(feature.modules))})")
    return name


def parse_modes(text: str | None, feature: Feature) -> ModeSpec:
    """One --flash-attn or --conv-direct string; None or empty: auto everywhere."""
    default = Switch.AUTO
    modules: dict[str, Switch] = {}
    for raw in (text or "").split(","):
        part = raw.strip()
        if not part:
            continue
        if "=" not in part:
            default = _switch(part, feature, part)
            continue
        key, value = part.split("=", 1)
        if key.strip().lower() in DEFAULT_KEYS:
            default = _switch(value, feature, part)
            continue
        name = _module_key(key, feature, part)
        modules.pop(name, None)
        modules[name] = _switch(value, feature, part)
    return ModeSpec(feature, default, tuple(modules.items()))


def legacy_modes(explicit: str | None, feature: Feature, *, all_on: bool = False, diffusion_on: bool = False,
                 vae_on: bool = False) -> str | None:
    """The mode string the deprecated switches stand for, unless an explicit string is given."""
    if explicit is not None:
        return explicit
    if feature is Feature.FLASH_ATTN:
        return "on" if all_on else ("off,diffusion=on" if diffusion_on else None)
    parts = (["diffusion=on", "controlnet=on"] if diffusion_on else []) + (["vae=on"] if vae_on else [])
    return ",".join(["auto", *parts]) if parts else None


# Seed 002: --fa and --diffusion-fa "write the same mode string as --flash-attn; the last occurrence
# of any of these options wins".
FLASH_ATTN_ALIASES: dict[str, str] = {"--fa": "on", "--diffusion-fa": "off,diffusion=on"}


def last_flash_attn(given: list[tuple[str, str | None]]) -> str | None:
    """The --flash-attn string of (flag, value) pairs in command-line order: --flash-attn's value,
    or an alias's string; the last one wins."""
    out = None
    for flag, value in given:
        out = FLASH_ATTN_ALIASES.get(flag, value)
    return out


# NVIDIA RTX hardware by its Vulkan device description: GeForce/TITAN/Quadro RTX, and the
# professional "NVIDIA RTX A6000" / "NVIDIA RTX 6000 Ada" names.
_RTX = re.compile(r"\b(GeForce RTX|TITAN RTX|Quadro RTX|NVIDIA RTX)\b", re.IGNORECASE)


def auto_decision(feature: Feature, backend: str, description: str = "") -> bool:
    """What `auto` selects on one compute device (see the module docstring)."""
    b = backend.upper()
    if feature is Feature.FLASH_ATTN:
        if b in (CPU, "CUDA"):
            return True
        return b == "VULKAN" and bool(_RTX.search(description))
    return b in ("CUDA", "MUSA")


def decide(spec: ModeSpec, module: str, devices: tuple[tuple[str, str], ...]) -> bool:
    """On or off for `module` computing on `devices` ((backend, description) pairs; empty: the CPU)."""
    switch = spec.of(module)
    if switch is not Switch.AUTO:
        return switch is Switch.ON
    devices = devices or ((CPU, ""),)
    return all(auto_decision(spec.feature, backend, desc) for backend, desc in devices)
