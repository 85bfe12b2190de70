"""Reading sd-cli's -v log: the lines below are sd-cli's own (SD 1.5 at 256x256, CPU)."""
from __future__ import annotations

import pytest

from planner.sd.sd_cli import SdCliError, parse_log

LOG = """\
[INFO ] stable-diffusion.cpp:908  - Version: SD 1.x
[INFO ] stable-diffusion.cpp:1745 - total params memory size = 2035.00MB (VRAM 0.00MB, RAM 2035.00MB): \
text_encoders 235.06MB(RAM), diffusion_model 1640.25MB(RAM), vae 159.68MB(RAM), controlnet 0.00MB(N/A), \
extensions 0.00MB(N/A)
[DEBUG] model_manager.cpp:406  - model manager prepared params backend buffer (235.06 MB, 196 tensors, RAM)
[DEBUG] ggml_extend.hpp:2241 - clip compute buffer size: 1.42 MB(RAM)
[DEBUG] model_manager.cpp:406  - model manager prepared params backend buffer (1640.25 MB, 686 tensors, RAM)
[DEBUG] ggml_extend.hpp:2241 - unet compute buffer size: 49.57 MB(RAM)
[DEBUG] model_manager.cpp:406  - model manager prepared params backend buffer ( 94.47 MB, 140 tensors, RAM)
[DEBUG] ggml_extend.hpp:2241 - vae compute buffer size: 416.02 MB(RAM)
"""
MiB = 1024 * 1024


def mib(x: float) -> int:
    return round(x * MiB)


def test_compute_params_and_totals():
    log = parse_log(LOG)
    assert log.compute == (("clip", mib(1.42)), ("unet", mib(49.57)), ("vae", mib(416.02)))
    assert log.params == (("RAM", mib(235.06), 196), ("RAM", mib(1640.25), 686), ("RAM", mib(94.47), 140))
    assert dict(log.totals) == {"text_encoders": mib(235.06), "diffusion_model": mib(1640.25), "vae": mib(159.68)}
    assert log.compute_of("unet") == mib(49.57)


def test_missing_runner_is_named():
    with pytest.raises(SdCliError, match="no compute buffer for 'mmdit'.*clip, unet, vae"):
        parse_log(LOG).compute_of("mmdit")
