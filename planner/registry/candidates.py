"""The files `fitplan choose` compares: each MODEL argument expanded into candidate models.

- A repository with no quant tag and no file named (`hf://ORG/REPO[@REV]`, `ORG/REPO`, `ms://ORG/REPO`):
  every model file of its listing (hub_rules.is_model_file: mmproj, imatrix and drafter files are not
  models), a split model as one candidate made of its shards (hub_rules.split_files), each read from its
  commit's URL. The `mmproj` files are the repository's projectors; each model notes the one llama.cpp
  would pair with it (hub_rules.best_sibling), for `--mmproj auto`.
- `ollama://NAME` with no tag: every tag of the model (ollama.list_tags), each its manifest's model layer.
- Anything else (a path, a URL, a reference naming a quant or a file, an Ollama name with a tag): one
  candidate, resolved as every command resolves MODEL (references.resolve_reference).

`include` narrows a listing (shell globs, case-insensitive, on the quant tag or the path); a listing
with more candidates than `cap` is refused with how to narrow it, before any header is read.
"""
from __future__ import annotations

import fnmatch
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

from planner.core.errors import BadInput
from planner.registry import hub, hub_rules, ollama, references

log = logging.getLogger(__name__)

# More candidates than this in one listing is refused: each costs a header read and a plan. A
# repository of a few hundred files (per-layer experiments, every imatrix variant) needs narrowing.
MAX_CANDIDATES = 40


@dataclass(frozen=True)
class Candidate:
    """One model file (or split model) to plan."""

    model: str                   # the MODEL argument it came from
    label: str                   # the quant tag, the Ollama tag, or the file's name
    location: str                # what the reader opens: the first shard's URL or path
    files: tuple[str, ...]       # its paths in the repository (every shard), or (location,)
    mmproj: str | None = None    # the projector llama.cpp would pair with it (a location)


@dataclass(frozen=True)
class Projector:
    """An mmproj file of a repository."""

    model: str
    path: str
    location: str


@dataclass(frozen=True)
class Expansion:
    source: str                            # where the candidates were listed ("org/repo@abc123", "ollama://x")
    candidates: tuple[Candidate, ...]
    projectors: tuple[Projector, ...] = ()


def _matches(patterns: Sequence[str], label: str, path: str) -> bool:
    if not patterns:
        return True
    names = (label.lower(), path.lower(), path.rsplit("/", 1)[-1].lower())
    return any(fnmatch.fnmatchcase(n, p.lower()) for p in patterns for n in names)


def _too_many(spec: str, where: str, n: int, cap: int) -> BadInput:
    return BadInput(f"{spec}: {where} holds {n} models to compare, more than the {cap} `choose` reads at once; "
                    f"narrow with --include (a quant tag or a glob on the path: --include 'Q4_*' --include Q8_0), "
                    f"name one file (hf://ORG/REPO:QUANT), or raise --max-files")


def _labels(primaries: Sequence[str]) -> list[str]:
    """Each model's quant tag, or its file name where the tag is missing or shared with another."""
    tags = [(hub_rules.split_info(p) or hub_rules.SplitInfo(p, "")).tag for p in primaries]
    out = []
    for path, tag in zip(primaries, tags, strict=True):
        info = hub_rules.split_info(path)
        name = (info.prefix if info else path).rsplit("/", 1)[-1]
        out.append(tag if tag and tags.count(tag) == 1 else name)
    return out


def from_listing(spec: str, listing: hub.Listing, include: Sequence[str], cap: int) -> Expansion:
    """The candidates of a repository listing (module docstring)."""
    files = listing.files
    ggufs = hub_rules.gguf_files(files)
    primaries = [f for f in files if hub_rules.is_model_file(f)
                 and (hub_rules.split_info(f) or hub_rules.SplitInfo(f, "")).index == 1]
    if not primaries:
        what = f"only companion files ({', '.join(ggufs[:4])})" if ggufs else "no GGUF file"
        raise BadInput(f"{spec}: {listing.where} holds {what}: no model to compare")
    labels = _labels(primaries)
    kept = [(p, lab) for p, lab in zip(primaries, labels, strict=True) if _matches(include, lab, p)]
    if not kept:
        raise BadInput(f"{spec}: no model of {listing.where} matches --include {' '.join(include)}; "
                       f"its quants: {', '.join(labels)}")
    if len(kept) > cap:
        raise _too_many(spec, listing.where, len(kept), cap)
    candidates = []
    for primary, label in kept:
        shards = hub_rules.split_files(files, primary)
        info = hub_rules.split_info(primary)
        if info is not None and info.count > 1 and len(shards) != info.count:
            log.warning("%s: %s is shard 1 of %d but %s holds %d of them: left out", spec, primary, info.count,
                        listing.where, len(shards))
            continue
        mmproj = hub_rules.best_sibling(files, primary, hub_rules.MMPROJ_KEYWORD)
        candidates.append(Candidate(spec, label, listing.location(shards[0]), shards,
                                    listing.location(mmproj) if mmproj else None))
    projectors = tuple(Projector(spec, f, listing.location(f)) for f in ggufs
                       if hub_rules.MMPROJ_KEYWORD in f.rsplit("/", 1)[-1])
    return Expansion(listing.where, tuple(candidates), projectors)


def _ollama_tags(spec: str, name: ollama.OllamaName, include: Sequence[str], cap: int) -> Expansion:
    tags = [t for t in ollama.list_tags(name) if _matches(include, t, t)]
    where = f"ollama://{name.namespace}/{name.model}"
    if not tags:
        raise BadInput(f"{spec}: no tag of {where} matches --include {' '.join(include)}")
    if len(tags) > cap:
        raise _too_many(spec, where, len(tags), cap)
    candidates = []
    for tag in tags:
        found = ollama.locate(replace(name, tag=tag))   # llama.cpp's view of the blob: when it is planned
        candidates.append(Candidate(spec, tag, found.location, (found.location,), found.projector))
    return Expansion(where, tuple(candidates))


def _repository(spec: str) -> hub.RepoRef | None:
    """The repository a spec names when it names no quant and no file; None for anything else."""
    for prefixes, hub_name in ((references.HF_PREFIXES, "hf"), (references.MS_PREFIXES, "ms")):
        for prefix in prefixes:
            if spec.startswith(prefix):
                ref = references.parse_repo(hub_name, spec.removeprefix(prefix), spec)
                return ref if not ref.tag and not ref.file else None
    if "://" not in spec and ":" not in spec.split("@", 1)[0] and references.is_repo_id(spec.split("@", 1)[0]):
        ref = references.parse_repo("hf", spec, spec)
        return ref if not ref.file else None
    return None


def _ollama_untagged(spec: str) -> ollama.OllamaName | None:
    if not spec.startswith(references.OLLAMA_PREFIX):
        return None
    text = spec.removeprefix(references.OLLAMA_PREFIX)
    if ":" in text.rsplit("/", 1)[-1]:
        return None
    return ollama.parse_name(text)


def expand(spec: str, include: Sequence[str] = (), cap: int = MAX_CANDIDATES) -> Expansion:
    """A MODEL argument's candidates (module docstring)."""
    if not os.path.exists(spec):
        repo = _repository(spec)
        if repo is not None:
            return from_listing(spec, hub.list_repository(repo), include, cap)
        name = _ollama_untagged(spec)
        if name is not None:
            return _ollama_tags(spec, name, include, cap)
    ref = references.resolve_reference(spec)
    info = hub_rules.split_info(spec.rsplit("/", 1)[-1])
    label = info.prefix if info else spec.rsplit("/", 1)[-1]
    return Expansion(spec, (Candidate(spec, label, spec, ref.shards or (ref.location,), ref.mmproj),))
