"""`fitplan sd-fit`: stable-diffusion.cpp's auto-fit plan for model files and devices.

The options are declared from planner.sd.roles (through planner.api), which reads no file.
"""
from __future__ import annotations

from typing import Annotated

import typer

from planner import api
from planner.api import DEFAULT_STEPS, Feature, FileRole, FlagError, ModelSource, last_flash_attn, legacy_modes
from planner.cli.options import Ram, choice

SIZE_STEP = 16   # the finest step of any model's sizes (video: 16; image models check 64 in planner.sd.sd_compute)



class SdFormat(api.OptionEnum):
    """`sd-fit --format`: the plan as text, sd-cli's placement flags, the whole sd-cli line, YAML or JSON."""

    __option__ = "--format"
    TEXT = "text"
    FLAGS = "flags"
    COMMAND = "command"
    YAML = "yaml"
    JSON = "json"


class AutoFit(api.OptionEnum):
    """sd-cli's --auto-fit switch."""

    __option__ = "--auto-fit"
    ON = "on"
    OFF = "off"


def _file_option(role: FileRole) -> typer.models.OptionInfo:
    return typer.Option(role.flag, help=f"a file loaded as sd-cli's {role.flag}")


def _sources(models: list[str], files: dict[FileRole, str | None]) -> tuple[ModelSource, ...]:
    out = [ModelSource(m) for m in models]
    out += [ModelSource(path, role) for role, path in files.items() if path]
    if not out:
        raise FlagError("sd-fit: no model; expected MODEL or a module file such as --diffusion-model")
    return tuple(out)


Text = str | None


def _opt(name: str, help_text: str) -> typer.models.OptionInfo:
    return typer.Option(name, help=help_text)


_FA_ORDER = "sd_fit_flash_attn_order"


def _fa_given(ctx: typer.Context, param: typer.CallbackParam, value: object) -> object:
    """Record --flash-attn / --fa / --diffusion-fa in command-line order (click processes given
    options in the order they appear): seed 002 lets the last of them win."""
    if value not in (None, False):
        ctx.meta.setdefault(_FA_ORDER, []).append((param.opts[0], value if isinstance(value, str) else None))
    return value


def _fa_opt(name: str, help_text: str) -> typer.models.OptionInfo:
    return typer.Option(name, help=help_text, callback=_fa_given)


def sd_fit_cmd(
    ctx: typer.Context,
    models: Annotated[list[str] | None, typer.Argument(help="checkpoint(s), as sd-cli -m")] = None,
    backend: Annotated[Text, _opt("--backend", "compute: cuda0 | te=cpu,vae=cuda0 | diffusion=cuda0&cuda1")] = None,
    params_backend: Annotated[Text, _opt("--params-backend", "parameters: cpu | disk | te=cpu,...")] = None,
    max_vram: Annotated[Text, _opt("--max-vram", "GiB per GPU: 6 | cuda0=6,vulkan0=2 | -2")] = None,
    auto_fit: Annotated[AutoFit, choice(AutoFit, "--auto-fit", help="on | off")] = AutoFit.ON,
    devices: Annotated[Text, _opt("--devices", "inventory YAML (default: this machine)")] = None,
    device: Annotated[list[str] | None, _opt("--device", "CUDA0=24GiB, 2xrtx3090, ...")] = None,
    ram: Ram = None,
    fmt: Annotated[SdFormat, choice(SdFormat, "--format",
                                    help="text | flags | command (the sd-cli line) | yaml | json")] = SdFormat.TEXT,
    optimal: Annotated[bool, _opt("--optimal", "minimise weight traffic per image (MILP)")] = False,
    steps: Annotated[int, _opt("--steps", "sampling steps per image, for traffic")] = DEFAULT_STEPS,
    split_mode: Annotated[Text, _opt("--split-mode", "layer | row | diffusion=row,te=layer")] = None,
    clip_on_cpu: Annotated[bool, _opt("--clip-on-cpu", "as sd-cli: prepend te=cpu to --backend")] = False,
    vae_on_cpu: Annotated[bool, _opt("--vae-on-cpu", "as sd-cli: prepend vae=cpu to --backend")] = False,
    control_net_cpu: Annotated[bool, _opt("--control-net-cpu", "as sd-cli: prepend controlnet=cpu")] = False,
    offload_to_cpu: Annotated[bool, _opt("--offload-to-cpu", "as sd-cli: prepend *=cpu to --params-backend")] = False,
    width: Annotated[int | None, typer.Option("--width", "-W", help="image width (sd-cli's default 512)")] = None,
    height: Annotated[int | None, typer.Option("--height", "-H", help="image height (default 512)")] = None,
    flash_attn: Annotated[Text, _fa_opt("--flash-attn", "on | off | auto, per module: auto,te=off,vae=on")] = None,
    conv_direct: Annotated[Text, _opt("--conv-direct", "on | off | auto, per module: auto,vae=off")] = None,
    vae_tiling: Annotated[bool, _opt("--vae-tiling", "decode the VAE in tiles")] = False,
    frames: Annotated[int, _opt("--frames", "video frames (video models; 1 for an image)")] = 1,
    batch: Annotated[int, typer.Option("--batch", "--batch-count", "-b",
                                       help="images per run, as sd-cli's -b (made one at a time)")] = 1,
    prompt_tokens: Annotated[int | None, _opt(
        "--prompt-tokens", "the prompt's length in its text encoder's tokens (CLIP's BPE for SD 1.x/2.x/XL/SD3, "
        "T5's for FLUX.1, Qwen3's for Z-Image; fitplan has no tokenizer, so sd-cli's -p text is not counted); the "
        "default is a short prompt, one chunk")] = None,
    mmap: Annotated[bool, _opt("--mmap", "as sd-cli: map the model files (counted whole where mapped)")] = False,
    fa: Annotated[bool, _fa_opt("--fa", "deprecated sd-cli switch: --flash-attn on")] = False,
    diffusion_fa: Annotated[bool, _fa_opt("--diffusion-fa", "deprecated: --flash-attn off,diffusion=on")] = False,
    diffusion_conv_direct: Annotated[bool, _opt("--diffusion-conv-direct",
                                                "deprecated: --conv-direct auto,diffusion=on,controlnet=on")] = False,
    vae_conv_direct: Annotated[bool, _opt("--vae-conv-direct", "deprecated: --conv-direct auto,vae=on")] = False,
    diffusion_model: Annotated[Text, _file_option(FileRole.DIFFUSION_MODEL)] = None,
    high_noise: Annotated[Text, _file_option(FileRole.HIGH_NOISE_DIFFUSION_MODEL)] = None,
    clip_l: Annotated[Text, _file_option(FileRole.CLIP_L)] = None,
    clip_g: Annotated[Text, _file_option(FileRole.CLIP_G)] = None,
    t5xxl: Annotated[Text, _file_option(FileRole.T5XXL)] = None,
    llm: Annotated[Text, _file_option(FileRole.LLM)] = None,
    llm_vision: Annotated[Text, _file_option(FileRole.LLM_VISION)] = None,
    vae: Annotated[Text, _file_option(FileRole.VAE)] = None,
    taesd: Annotated[Text, _file_option(FileRole.TAESD)] = None,
) -> None:
    """stable-diffusion.cpp placement: sd-cli's auto-fit plan and the flags that reproduce it."""
    if steps < 1:
        raise FlagError(f"--steps {steps}: expected at least 1")
    for flag, value in (("--backend", backend), ("--params-backend", params_backend), ("--max-vram", max_vram),
                        ("--split-mode", split_mode)):
        if value is not None and not value.strip():   # sd-cli reads '' as unset; here it is an unset variable
            raise FlagError(f"{flag} '': empty; expected a value (see fitplan sd-fit --help)")
    files = {FileRole.DIFFUSION_MODEL: diffusion_model, FileRole.HIGH_NOISE_DIFFUSION_MODEL: high_noise,
             FileRole.CLIP_L: clip_l, FileRole.CLIP_G: clip_g, FileRole.T5XXL: t5xxl, FileRole.LLM: llm,
             FileRole.LLM_VISION: llm_vision, FileRole.VAE: vae, FileRole.TAESD: taesd}
    compat = tuple(flag for flag, on in (("--clip-on-cpu", clip_on_cpu), ("--vae-on-cpu", vae_on_cpu),
                                         ("--control-net-cpu", control_net_cpu),
                                         ("--offload-to-cpu", offload_to_cpu)) if on)
    for flag, size in (("--width", width), ("--height", height)):
        if size is not None and (size <= 0 or size % SIZE_STEP):
            raise FlagError(f"{flag} {size}: expected a positive multiple of {SIZE_STEP}")
    # Seed 002: the deprecated switches write mode strings; an explicit --flash-attn/--conv-direct wins.
    fa_modes = last_flash_attn(ctx.meta.get(_FA_ORDER, []))
    cd_modes = legacy_modes(conv_direct, Feature.CONV_DIRECT, diffusion_on=diffusion_conv_direct,
                            vae_on=vae_conv_direct)
    request = api.SdFitRequest(_sources(models or [], files), backend, params_backend, max_vram,
                           AutoFit(auto_fit) is AutoFit.ON, optimal, steps, split_mode, compat,
                           width, height, fa_modes, cd_modes, vae_tiling, frames=frames, mmap=mmap, batch=batch,
                           prompt_tokens=prompt_tokens)
    machine = api.InventoryOptions(devices, tuple(device or ()), ram).inventory(detect=True, use_llama=False)
    assert machine is not None   # detect=True always gives an inventory
    _show(api.sd_fit(request, machine), str(SdFormat(fmt)))


def _show(plan: api.SdPlan, fmt: str) -> None:
    """--format: `flags` are sd-cli's placement flags, `command` the whole sd-cli line; `text` is what
    render() calls `table`."""
    if fmt in ("flags", "command"):
        typer.echo(plan.flags if fmt == "flags" else plan.command)
    else:
        typer.echo(api.render(plan, "table" if fmt == "text" else fmt))
