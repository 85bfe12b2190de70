"""Write a shape-faithful stable-diffusion.cpp model (planner/synth/shapes_sd.py: every tensor of
the released files under its own name and shape, sparse data) and print the sd-cli file flags that
load it.

    python scripts/write_sd_shapes.py sd15|sdxl|sd2|flux|wan|wan22 DIRECTORY

SD 1.5, SDXL and SD 2.1 768-v (F32) are one checkpoint each (-m); FLUX.1 [dev] is its four files (DiT
BF16, T5-XXL and CLIP-L F16, the 16-channel autoencoder F32); Wan2.1-T2V-1.3B and Wan2.2-TI2V-5B
(wan22) their three each (planner/synth/shapes_wan.py).
Files already there are kept.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from planner.synth.shapes_sd import CHECKPOINTS, FLUX_FILES, write_checkpoint, write_flux
from planner.synth.shapes_wan import write_wan, write_wan22

MULTI_FILE = ("flux", "wan", "wan22")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in (*CHECKPOINTS, *MULTI_FILE):
        print(f"usage: write_sd_shapes.py {'|'.join((*CHECKPOINTS, *MULTI_FILE))} DIRECTORY", file=sys.stderr)
        return 2
    family, directory = argv[0], Path(argv[1])
    directory.mkdir(parents=True, exist_ok=True)
    if family == "flux":
        paths = {flag: directory / f"flux-{flag.strip('-')}.safetensors" for flag in FLUX_FILES}
        if not all(p.exists() for p in paths.values()):
            paths = write_flux(directory)
        args = [a for flag, path in paths.items() for a in (flag, str(path))]
    elif family == "wan":
        args = [a for flag, path in write_wan(directory).items() for a in (flag, str(path))]
    elif family == "wan22":
        args = [a for flag, path in write_wan22(directory).items() for a in (flag, str(path))]
    else:
        path = directory / f"{family}.safetensors"
        if not path.exists():
            write_checkpoint(family, path)
        args = ["-m", str(path)]
    print(shlex.join(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
