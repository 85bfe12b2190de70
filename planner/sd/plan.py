"""An sd-fit result and its renderings: sd-cli's auto-fit report, flags, plain data."""
from __future__ import annotations

import enum
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from planner.core.units import MiB
from planner.sd.assign import ALL_KEY, SplitMode
from planner.sd.check import DeviceNeed
from planner.sd.components import CURVE, FALLBACK, KIND_LABEL
from planner.sd.roles import Kind
from planner.sd.sd_compute import CORPUS_MAX_SIDE, FIT_VIDEO
from planner.sd.sd_placement import GpuBudget, Placement, Where
from planner.sd.split import SplitRange

SD_CLI = "sd-cli"
# The most frames a video model's figures were recorded at: sd-fit searches no further where a curve gives a figure
MAX_RECORDED_FRAMES = max(f for points in FIT_VIDEO.values() for _, _, f in points)
# Where every compute figure is simulated (runtime/sd reserves the graph at any size) sd-fit searches further:
# sd-cli sets no upper bound on -W/-H (it only aligns them up), so to a side of its own choosing, and to
# Wan's usual longest clip (81 frames)
SIMULATED_MAX_SIDE = 2048
SIMULATED_MAX_FRAMES = 81


def search_limits(origins: Iterable[str]) -> tuple[int, int]:
    """The largest square side and frame count sd-fit searches to, given its compute figures' origins
    (Component.compute_origin): the corpus's largest where any figure comes from a curve (the curves are
    not extrapolated), SIMULATED_MAX_SIDE / SIMULATED_MAX_FRAMES where none does."""
    if CURVE in set(origins):
        return CORPUS_MAX_SIDE, MAX_RECORDED_FRAMES
    return SIMULATED_MAX_SIDE, SIMULATED_MAX_FRAMES


class Mode(enum.Enum):
    """How a plan was made; the value is what the report prints."""

    AUTO_FIT = "auto-fit"
    OPTIMAL = "optimal"
    MANUAL = "manual"  # auto-fit off, or disabled by --params-backend


@dataclass(frozen=True)
class SdPlan:
    mode: Mode
    gpus: tuple[GpuBudget, ...]
    ram_free_bytes: int | None
    ram_budget_bytes: int | None
    placements: tuple[Placement, ...]
    splits: tuple[tuple[Kind, tuple[SplitRange, ...]], ...]
    backend_spec: str
    params_spec: str
    max_vram: str | None
    split_mode: str | None
    traffic_bytes: int  # weight bytes moved per image (see planner.sd.traffic)
    warnings: tuple[str, ...] = ()  # budgets this placement exceeds (planner.sd.check)
    model_args: tuple[str, ...] = ()  # the model files as sd-cli flags: -m X, --vae Y, ...
    render_args: tuple[str, ...] = ()  # -W/-H, --flash-attn, --conv-direct as asked, --vae-tiling where planned
    width: int = 512
    height: int = 512
    vae_tiling: bool = False
    params_buffers: tuple[tuple[Kind, int], ...] = ()  # sd-cli's params buffer per component
    largest_side: int | None = None  # the largest square image that fits (None: not size-dependent)
    needs: tuple[DeviceNeed, ...] = ()  # the figures behind the verdict: each GPU, then RAM
    largest_frames: int | None = None  # a video model's largest frame count at this size (None: an image model)
    frames: int = 1
    batch: int = 1   # sd-cli's -b: images per run, made one at a time (planner/sd/fit.py _check_batch)
    prompt_tokens: int | None = None   # the prompt's tokens as asked (None: a short prompt, one chunk)
    prompt_sized: bool = False   # the diffusion model's family sizes its buffers by the prompt's length
    # sd-cli's own auto-fit placement is over budget even after its VAE tiling retries; the plan is then the
    # first explicit placement that fits (its flags turn auto-fit off), or auto-fit's, with the closest one's
    # needs and flags (planner/sd/ladder.py)
    auto_fit_fails: bool = False
    closest_needs: tuple[DeviceNeed, ...] = ()
    closest_args: tuple[str, ...] = ()
    largest_side_auto_fit: int | None = None     # the largest square / most frames sd-cli's auto-fit itself fits
    largest_frames_auto_fit: int | None = None

    @property
    def verdict(self) -> str:
        """The answer in words: fits / fits with VAE tiling / fits with parameters off the GPU / does not fit."""
        if self.warnings:
            return "does not fit"
        off = sorted({p.params.value for p in self.placements if p.params is not Where.RESIDENT and p.compute})
        if off:
            where = " and ".join({"cpu": "the host", "disk": "disk", "other-gpu": "another GPU"}[o] for o in off)
            return f"fits with parameters on {where}" + (" and VAE tiling" if self.vae_tiling else "")
        return "fits with VAE tiling" if self.vae_tiling else "fits"

    @property
    def flag_argv(self) -> list[str]:
        """sd-cli flags that reproduce this plan without re-planning."""
        out = ["--backend", self.backend_spec or "auto"]
        if self.params_spec:
            out += ["--params-backend", self.params_spec]  # a params assignment disables auto-fit
        else:
            out += ["--auto-fit", "off"]
        if self.max_vram:
            out += ["--max-vram", self.max_vram]
        if self.split_mode:
            out += ["--split-mode", self.split_mode]
        return out + list(self.render_args)

    @property
    def flags(self) -> str:
        """The flags as one shell-quoted string."""
        return shlex.join(self.flag_argv)

    @property
    def argv(self) -> list[str]:
        """sd-cli's arguments: the model files as they were given, then the flags."""
        return list(self.model_args) + self.flag_argv

    @property
    def command(self) -> str:
        """The sd-cli line, shell-quoted: bash runs it as printed (add the prompt, -p ...)."""
        return shlex.join([SD_CLI, *self.argv])

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "devices": [{"name": g.name, "free_bytes": g.free_bytes, "budget_bytes": g.budget_bytes}
                        for g in self.gpus],
            "ram": {"free_bytes": self.ram_free_bytes, "params_budget_bytes": self.ram_budget_bytes},
            "image": {"width": self.width, "height": self.height, "frames": self.frames, "vae_tiling": self.vae_tiling,
                      "batch": self.batch},
            "prompt": {"tokens": self.prompt_tokens, "sized_by_length": self.prompt_sized},
            "verdict": self.verdict,
            "largest_square": self.largest_side,
            "largest_frames": self.largest_frames,
            "largest_square_auto_fit": self.largest_side_auto_fit,
            "largest_frames_auto_fit": self.largest_frames_auto_fit,
            "per_device": [{"name": d.device, "weights_bytes": d.weights_bytes, "compute_bytes": d.compute_bytes,
                            "need_bytes": d.need_bytes, "cap_bytes": d.cap_bytes, "fits": d.fits}
                           for d in self.needs],
            "components": [{
                "module": p.kind.name.lower(), "params_bytes": p.params_bytes,
                "params_buffer_bytes": dict(self.params_buffers).get(p.kind),
                "compute_reserve_bytes": p.reserve_bytes, "compute_source": p.compute_source,
                "compute": p.compute_name,
                "params": p.params_name, "params_location": p.params.value,
            } for p in self.placements],
            "splits": {kind.name.lower(): [{"mode": r.mode.value, "device": r.device, "first_block": r.first_block,
                                            "end_block": r.end_block, "bytes": r.total_bytes} for r in ranges]
                       for kind, ranges in self.splits},
            "backend": self.backend_spec,
            "params_backend": self.params_spec,
            "traffic_bytes_per_image": self.traffic_bytes,
            "warnings": list(self.warnings),
            "auto_fit_fails": self.auto_fit_fails,
            "closest": None if not self.closest_args else {
                "flags": shlex.join(self.closest_args),
                "per_device": [{"name": d.device, "weights_bytes": d.weights_bytes, "compute_bytes": d.compute_bytes,
                                "need_bytes": d.need_bytes, "cap_bytes": d.cap_bytes, "fits": d.fits}
                               for d in self.closest_needs]},
            "flags": self.flags,
            "argv": self.argv,
        }

    def _title(self) -> str:
        computes = sorted({p.compute_name for p in self.placements if p.compute})
        where = ", ".join(computes) or "cpu"
        if self.auto_fit_fails and self.mode is Mode.MANUAL:
            return f"explicit placement (sd-cli's auto-fit would not fit; compute on {where}):"
        return {Mode.AUTO_FIT: f"auto-fit plan (compute on {where}):",
                Mode.OPTIMAL: f"optimal plan (min weight traffic; compute on {where}):",
                Mode.MANUAL: "placement (auto-fit off; as assigned):"}[self.mode]

    def _answer_lines(self) -> list[str]:
        """Each device's need against its cap, the verdict at the asked size and the largest that fits."""
        lines = []
        for d in self.needs:
            lines.append(f"  {d.device:<12} weights {d.weights_bytes // MiB:6d} + compute {d.compute_bytes // MiB:5d} "
                         f"= {d.need_bytes // MiB:6d} MiB of {d.cap_bytes // MiB:6d} MiB"
                         + ("" if d.fits else "  (over)"))
        frames = f"x{self.frames} frames" if self.frames != 1 else ""
        lines.append(f"{self.width}x{self.height}{frames}: {self.verdict}")
        lines += [f"{KIND_LABEL[p.kind]} on {p.compute_name}: the device refuses nodes of its graph at this size (a "
                  f"tensor over its storage buffer range); sd-cli runs it through its CPU fallback, those nodes "
                  f"computing on the host, whose buffers are not modelled: the fixed {p.reserve_bytes // MiB} MiB "
                  f"reserve stands in" for p in self.placements if p.compute_origin == FALLBACK]
        lines += self._ladder_lines()
        if self.batch != 1:
            lines.append(f"batch of {self.batch}: sd-cli samples and decodes the images one at a time, so every "
                         f"buffer above is one image's, the same as at -b 1")
        if self.prompt_tokens is not None:
            lines.append(f"prompt of {self.prompt_tokens} tokens: "
                         + ("the text encoder's chunks set the diffusion model's context" if self.prompt_sized else
                            "this model is sized for a prompt of one chunk whatever its length (sd-fit models the "
                            "length for SD 1.x, SD 2.x, SDXL, SD3.5 medium, FLUX.1 and Z-Image only)"))
        max_side, max_frames = search_limits(p.compute_origin for p in self.placements)
        curve = max_side == CORPUS_MAX_SIDE
        if self.largest_side is not None:
            more = "" if self.largest_side < max_side else \
                " or larger (sizes above it are beyond sd-cli's recorded figures)" if curve else \
                f" or larger (sd-fit searches no further than {max_side}x{max_side})"
            alone = self.largest_side_auto_fit
            more += "" if alone == self.largest_side else \
                f"; with sd-cli's auto-fit alone: {f'{alone}x{alone}' if alone else 'none'}"
            lines.append(f"largest square image that fits: {self.largest_side}x{self.largest_side}{more}")
        if self.largest_frames is not None:
            more = "" if self.largest_frames < max_frames else \
                " or more (beyond sd-cli's recorded figures)" if curve else \
                f" or more (sd-fit searches no further than {max_frames})"
            alone = self.largest_frames_auto_fit
            more += "" if alone == self.largest_frames else f"; with sd-cli's auto-fit alone: {alone or 'none'}"
            lines.append(f"most frames that fit at {self.width}x{self.height}: {self.largest_frames}{more}")
        return lines

    def _ladder_lines(self) -> list[str]:
        """Why the plan is explicit (auto-fit would fail), or the closest explicit placement's needs."""
        if not self.auto_fit_fails:
            return []
        if not self.warnings:
            return ["sd-cli's auto-fit would not fit this (its placement is over budget even with the VAE "
                    "tiling retries): pass the flags below; an explicit --params-backend turns auto-fit off"]
        lines = ["no explicit placement fits either; the closest needs:"]
        lines += [f"  {d.device:<12} weights {d.weights_bytes // MiB:6d} + compute {d.compute_bytes // MiB:5d} "
                  f"= {d.need_bytes // MiB:6d} MiB of {d.cap_bytes // MiB:6d} MiB" + ("" if d.fits else "  (over)")
                  for d in self.closest_needs]
        lines.append(f"  with: {shlex.join(self.closest_args)}")
        return lines

    def to_table(self) -> str:
        lines = [self._title(), "  devices:"]
        for g in self.gpus:
            desc = f"{g.description:<32} " if g.description else ""
            lines.append(f"    {g.name:<12} {desc}free {g.free_bytes // MiB:6d} MiB, "
                         f"budget {g.budget_bytes // MiB:6d} MiB")
        if self.ram_free_bytes is None:
            lines.append("    RAM          available RAM unknown; CPU parameter residency skipped")
        else:
            lines.append(f"    RAM          free {self.ram_free_bytes // MiB:6d} MiB, "
                         f"params budget {(self.ram_budget_bytes or 0) // MiB:6d} MiB")
        lines.append("  components:" if self.mode is Mode.MANUAL else
                     "  components (params: compute GPU -> RAM -> other GPU -> disk):")
        for p in self.placements:
            lines.append(f"    {KIND_LABEL[p.kind]:<12} params {p.params_bytes // MiB:6d} MiB, "
                         f"compute {p.reserve_bytes // MiB:5d} MiB ({p.compute_source}) -> compute "
                         f"{p.compute_name}, params {p.params_name}")
        for kind, ranges in self.splits:
            for r in ranges:
                what = (f"blocks [{r.first_block}, {r.end_block}) of {r.n_blocks_total}" if r.mode is SplitMode.LAYER
                        else f"rows of {r.n_blocks_total} blocks")
                lines.append(f"    {r.mode.value} split {kind.name.lower()}: {r.device} <- {what}, "
                             f"{r.total_bytes // MiB} MiB")
        lines.append(f"  weight traffic per image: {self.traffic_bytes // MiB} MiB")
        lines += [f"  warning: {w}" for w in self.warnings]
        lines += self._answer_lines()
        params = f' --params-backend "{self.params_spec}"' if self.params_spec else ""
        label = ("explicit" if self.auto_fit_fails else "as assigned") if self.mode is Mode.MANUAL \
            else self.mode.value
        lines.append(f'{label}: --backend "{self.backend_spec or "(default)"}"{params}')
        lines.append(f"sd-cli flags: {self.flags}")
        lines.append(f"run it: {self.command}")
        return "\n".join(lines)


def specs(placements: tuple[Placement, ...], keep_backend: list[tuple[str, str]],
          keep_params: list[tuple[str, str]]) -> tuple[str, str]:
    """--backend and --params-backend strings: the user's entries for modules sd-fit does not
    place (`keep_*`, a default first), then one entry per component — parameters only where
    they do not follow the runtime backend (backend_fit.cpp's derived specs)."""
    runtime = [f"{k}={v}" for k, v in keep_backend]
    params = [f"{k}={v}" for k, v in keep_params]
    # Under a kept params default, a resident component must be named or it would inherit that
    # default; --params-backend takes no device lists, so a split names its main device.
    name_resident = any(k == ALL_KEY for k, _ in keep_params)
    for p in placements:
        key = p.kind.name.lower()
        runtime.append(f"{key}={p.compute_name}")
        if p.params is not Where.RESIDENT:
            params.append(f"{key}={p.params_name}")
        elif name_resident:
            params.append(f"{key}={p.compute[0] if p.compute else 'cpu'}")
    return ",".join(runtime), ",".join(params)
