"""Header-only GGUF files: a model's metadata and tensor index without its weights, written to
plan offline later (`fitplan fetch-header`). Each shard's header is copied byte for byte, the
alignment padding included, so the file hashes as the model does (`ModelFile.header_sha256`)
and a plan made from it validates against the full model."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.core.render import table
from planner.core.units import fmt_bytes
from planner.gguf.reader import read_header_bytes, read_model, shard_paths
from planner.system.files import write_atomic

GGUF_SUFFIX = ".gguf"


@dataclass(frozen=True)
class HeaderFile:
    source: str                  # the model location read (a path or a URL)
    written: tuple[str, ...]     # the files written, first shard first
    header_bytes: int            # all of them together
    model_bytes: int             # the tensor data they describe and do not hold
    architecture: str
    n_tensors: int

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "written": list(self.written), "header_bytes": self.header_bytes,
                "model_bytes": self.model_bytes, "architecture": self.architecture, "n_tensors": self.n_tensors}

    def to_table(self) -> str:
        rows = [[path, fmt_bytes(Path(path).stat().st_size)] for path in self.written]
        return (table(["header-only file", "size"], rows) +
                f"\n{self.architecture}, {self.n_tensors} tensors, {fmt_bytes(self.model_bytes)} of weights "
                f"left out; plan with it as with the model: fitplan plan {self.written[0]} ...")


def _outputs(output: str, count: int) -> list[str]:
    """Where the shards go: `output` itself for one file; for a split model, names that keep
    gguf-split's `-0000i-of-0000N.gguf` pattern, so the reader finds every shard again."""
    if count == 1:
        return [output]
    named = shard_paths(output)
    if len(named) == count:
        return named
    stem = output[:-len(GGUF_SUFFIX)] if output.endswith(GGUF_SUFFIX) else output
    return shard_paths(f"{stem}-00001-of-{count:05d}{GGUF_SUFFIX}")


def _write(path: str, data: bytes) -> None:
    def write(tmp: Path) -> None:
        tmp.write_bytes(data)

    write_atomic(path, write)


def write_header_file(location: str, output: str) -> HeaderFile:
    """Write `location`'s header (every shard's, for a split model) as a header-only file at
    `output`; the written file is read back as a model before this returns."""
    first = read_header_bytes(location)
    sources = shard_paths(location) if first.split_count > 1 else [location]
    outputs = _outputs(output, len(sources))
    headers = [first.data if src == location else read_header_bytes(src).data for src in sources]
    for out, data in zip(outputs, headers, strict=True):
        _write(out, data)
    model = read_model(outputs[0])
    return HeaderFile(location, tuple(outputs), sum(len(h) for h in headers), model.total_tensor_bytes,
                      model.architecture, len(model.tensors))
