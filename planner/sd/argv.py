"""sd-cli's command-line flags as far as sd-fit reads them, from an argument vector: the base flags
`fitplan sweep MODEL --vary res=... -- <sd-cli flags>` gives after `--`.

One table names each flag's field of SdFitRequest (planner/sd/fit.py); model-file flags
(planner/sd/roles.py FileRole) add a file; the compatibility and deprecated switches are collected
as `fitplan sd-fit` collects them (planner/sd/modes.py legacy_modes, planner/sd/assign.py COMPAT_FLAGS).
"""
from __future__ import annotations

from collections.abc import Sequence

from planner.core.errors import FlagError
from planner.core.units import quote
from planner.sd.assign import COMPAT_FLAGS
from planner.sd.fit import SdFitRequest
from planner.sd.modes import FLASH_ATTN_ALIASES, Feature, last_flash_attn, legacy_modes
from planner.sd.roles import DEFAULT_STEPS, FileRole, ModelSource

# flags that take a value -> the SdFitRequest field it sets (as text)
VALUE_FLAGS: dict[str, str] = {
    "--backend": "backend", "--params-backend": "params_backend", "--max-vram": "max_vram",
    "--split-mode": "split_mode", "--flash-attn": "flash_attn", "--conv-direct": "conv_direct",
}
INT_FLAGS: dict[str, str] = {"--steps": "steps", "--video-frames": "frames", "--frames": "frames",
                             "-b": "batch", "--batch-count": "batch"}
SWITCHES = ("--vae-tiling", "--mmap")
LEGACY = ("--fa", "--diffusion-fa", "--diffusion-conv-direct", "--vae-conv-direct")
_FILES = {role.flag: role for role in FileRole}
_AUTO_FIT = {"on": True, "off": False}


def _value(argv: Sequence[str], i: int) -> str:
    if i + 1 >= len(argv):
        raise FlagError(f"{argv[i]}: expected a value")
    return argv[i + 1]


def request_from_argv(models: Sequence[str], argv: Sequence[str]) -> SdFitRequest:
    """An SdFitRequest for the model file(s) `models` (sd-cli's -m) and sd-cli flags `argv`."""
    sources = [ModelSource(m) for m in models]
    texts: dict[str, str] = {}
    ints: dict[str, int] = {}
    seen: set[str] = set()
    fa_given: list[tuple[str, str | None]] = []   # seed 002: the last of --flash-attn, --fa, --diffusion-fa wins
    auto_fit = True
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag in SWITCHES or flag in LEGACY or flag in COMPAT_FLAGS:
            seen.add(flag)
            fa_given += [(flag, None)] if flag in FLASH_ATTN_ALIASES else []
            i += 1
            continue
        value = _value(argv, i)
        fa_given += [(flag, value)] if flag == "--flash-attn" else []
        if flag in _FILES:
            sources.append(ModelSource(value, _FILES[flag]))
        elif flag in VALUE_FLAGS:
            texts[VALUE_FLAGS[flag]] = value
        elif flag in INT_FLAGS:
            if not value.isascii() or not value.lstrip("-").isdigit():
                raise FlagError(f"{flag} {quote(value)}: expected a whole number")
            ints[INT_FLAGS[flag]] = int(value)
        elif flag == "--auto-fit" and value.strip().lower() in _AUTO_FIT:
            auto_fit = _AUTO_FIT[value.strip().lower()]
        else:
            raise FlagError(f"{quote(flag)} {quote(value)}: not an sd-cli flag sd-fit reads (model files, --backend, "
                            f"--params-backend, --max-vram, --auto-fit on|off, --flash-attn, --conv-direct, ...)")
        i += 2
    if not sources:
        raise FlagError("no model; expected MODEL or a module file such as --diffusion-model")
    return SdFitRequest(
        tuple(sources), texts.get("backend"), texts.get("params_backend"), texts.get("max_vram"), auto_fit,
        steps=ints.get("steps", DEFAULT_STEPS), split_mode=texts.get("split_mode"),
        compat=tuple(f for f in COMPAT_FLAGS if f in seen),
        flash_attn=last_flash_attn(fa_given),
        conv_direct=legacy_modes(texts.get("conv_direct"), Feature.CONV_DIRECT,
                                 diffusion_on="--diffusion-conv-direct" in seen, vae_on="--vae-conv-direct" in seen),
        vae_tiling="--vae-tiling" in seen, mmap="--mmap" in seen, frames=ints.get("frames", 1),
        batch=ints.get("batch", 1))
