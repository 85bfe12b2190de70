"""What sd-cli is told on its command line, kept free of file reading so that declaring the
`fitplan sd-fit` options loads nothing heavy: the components, the model-file flags and the
defaults sd-cli uses.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

# sd-cli's default --steps; text encoders and the VAE run once per image.
DEFAULT_STEPS = 20


class Kind(enum.IntEnum):
    """Auto-fit's components, valued in seed 002's priority order (diffusion, te, vae)."""

    DIFFUSION = 0
    TE = 1
    VAE = 2


class FileRole(enum.Enum):
    """sd-cli's model-file flags; each gives its file's tensors a name prefix and a component.

    Prefixes from src/stable-diffusion.cpp (`init_from_file(path, prefix)` calls).
    """

    MODEL = ("-m", None, "")
    DIFFUSION_MODEL = ("--diffusion-model", Kind.DIFFUSION, "model.diffusion_model.")
    HIGH_NOISE_DIFFUSION_MODEL = ("--high-noise-diffusion-model", Kind.DIFFUSION, "model.high_noise_diffusion_model.")
    CLIP_L = ("--clip_l", Kind.TE, "clip_l.")
    CLIP_G = ("--clip_g", Kind.TE, "clip_g.")
    T5XXL = ("--t5xxl", Kind.TE, "text_encoders.t5xxl.transformer.")
    LLM = ("--llm", Kind.TE, "text_encoders.llm.")
    LLM_VISION = ("--llm_vision", Kind.TE, "text_encoders.llm.visual.")
    VAE = ("--vae", Kind.VAE, "vae.")
    TAESD = ("--taesd", Kind.VAE, "tae.")

    @property
    def flag(self) -> str:
        return self.value[0]

    @property
    def kind(self) -> Kind | None:
        """The component every tensor of the file belongs to; None: classify each by name."""
        return self.value[1]

    @property
    def prefix(self) -> str:
        return self.value[2]


@dataclass(frozen=True)
class ModelSource:
    path: str
    role: FileRole = FileRole.MODEL
