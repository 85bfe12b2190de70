"""Reading sd-cli's -v log: the lines below are sd-cli's own (SD 1.5 at 256x256, CPU)."""
from __future__ import annotations

import pytest

from planner.sd.sd_cli import SdCliError, parse_log, run_sd_cli

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


# sd-cli -b 2 (SD 1.5 at 256x256, CPU): CLIP once, then the UNet's buffer per image, the VAE's per latent
BATCH_LOG = """\
[DEBUG] ggml_extend.hpp:2241 - clip compute buffer size: 1.42 MB(RAM)
[INFO ] stable-diffusion.cpp:5679 - generating image: 1/2 - seed 1
[DEBUG] ggml_extend.hpp:2241 - unet compute buffer size: 49.57 MB(RAM)
[INFO ] stable-diffusion.cpp:5711 - sampling completed, taking 27.88s
[INFO ] stable-diffusion.cpp:5679 - generating image: 2/2 - seed 2
[DEBUG] ggml_extend.hpp:2241 - unet compute buffer size: 49.57 MB(RAM)
[INFO ] stable-diffusion.cpp:5321 - decoding 2 latents
[DEBUG] ggml_extend.hpp:2241 - vae compute buffer size: 416.02 MB(RAM)
"""


def test_a_batch_logs_each_image():
    log = parse_log(BATCH_LOG)
    assert log.logged_of("unet") == (mib(49.57), mib(49.57))
    assert log.logged_of("clip") == (mib(1.42),) and log.logged_of("mmdit") == ()


@pytest.mark.parametrize("stop_after", [1, 2])
def test_a_run_stops_after_the_asked_logs(tmp_path, stop_after):
    """stop_when=["unet"], stop_after=N: the run ends at the N-th unet buffer, before the VAE's (a fake
    sd-cli prints the batch log, then would hang: the run kills it and keeps the log so far)."""
    log = tmp_path / "log.txt"
    log.write_text(BATCH_LOG)
    exe = tmp_path / "sd-cli"
    exe.write_text(f"#!/bin/sh\ncat {log}\nexec sleep 60\n")
    exe.chmod(0o755)
    got = run_sd_cli([], exe=exe, stop_when=["unet"], stop_after=stop_after, timeout_s=30)
    assert got.logged_of("unet") == (mib(49.57),) * stop_after and got.logged_of("vae") == ()
