"""sd-cli's recorded compute buffers (planner/sd/data/sd_cli_corpus.json) as the runtime/sd tests read them.

sd-cli logs "<runner> compute buffer size: %.2f MB" (src/core/ggml_extend.hpp alloc_compute_buffer, MB
meaning MiB), so a simulated buffer printed the same way must read the same.
"""
from __future__ import annotations

from planner.sd.sd_compute import Row, corpus, video_corpus

MiB = 1 << 20


def logged(n_bytes: int) -> str:
    """A buffer as sd-cli prints it."""
    return f"{n_bytes / MiB:.2f}"


def rows(family: str, runner: str) -> list[Row]:
    found = [r for r in corpus() if r.family == family and r.runner == runner]
    assert found, f"the corpus has no {family} {runner} rows"
    return found


def video_rows(family: str, runner: str) -> list[Row]:
    found = [r for r in video_corpus() if r.family == family and r.runner == runner]
    assert found, f"the corpus has no {family} {runner} rows"
    return found


def row_id(r: Row) -> str:
    frames = f"x{r.frames}f" if r.frames != 1 else ""
    batch = f"-b{r.batch}" if r.batch != 1 else ""
    prompt = f"-p{r.prompt_tokens}" if r.prompt_tokens is not None else ""
    return f"{r.width}x{r.height}{frames}-{r.mode.key}{'-tiled' if r.tiled else ''}{batch}{prompt}"
