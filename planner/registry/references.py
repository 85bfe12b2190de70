"""What a MODEL argument names: a local file, a URL, or a model in a Hugging Face, ModelScope or Ollama store.

`resolve_reference(spec)` turns the argument into a location the reader opens (a local path or an http(s) URL; a
split model by its first shard) plus what it found on the way (every shard, the `mmproj` sibling, warnings). One
precedence, first match wins:

1. An existing local path, whatever it looks like (`./hf:model.gguf` stays a file).
2. Explicit schemes: `example:NAME` (a bundled example, planner.registry.examples); `http(s)://…`, read by Range (a
   Hugging Face page URL `…/blob/REV/FILE` read from its `…/resolve/REV/FILE`); `hf://ORG/REPO/PATH/FILE.gguf`,
   `hf://ORG/REPO[:QUANT][@REVISION]`, `hf://ORG/REPO@REVISION/FILE.gguf`, and the same after `hf.co/` or
   `huggingface.co/`; `ms://ORG/REPO[:QUANT][@REVISION]` (or `modelscope.cn/…`) against ModelScope;
   `ollama://[HOST/][NAMESPACE/]NAME[:TAG]`, the local Ollama store then its registry. Any other `SCHEME://` is
   refused.
3. Bare forms, as a llama.cpp user types them: `ORG/REPO[:QUANT]` as `-hf` takes it (one '/', hf-cache.cpp's repo
   id rule) unless it ends in `.gguf`/`.safetensors` (then a missing relative path); `NAME[:TAG]` with no '/',
   an Ollama model only when the local store has it (llama.cpp has no such form); anything else is a path.

A repository reference resolves as the pinned llama.cpp's `-hf` does (hub_rules: the quant tag, or Q4_K_M then
Q8_0 then the first model file; every split shard; the mmproj sibling), from the local caches first (hub.py:
LLAMA_CACHE, the hub cache), then the network. Each spec is resolved once per process and settings.
"""
from __future__ import annotations

import enum
import logging
import os
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from planner.core.errors import BadInput
from planner.registry import hub, ollama
from planner.system import net

log = logging.getLogger(__name__)


class Source(enum.Enum):
    LOCAL = "local file"
    EXAMPLE = "bundled example"
    URL = "URL"
    HF_CACHE = "Hugging Face cache"
    HF = "Hugging Face"
    MODELSCOPE = "ModelScope"
    OLLAMA_STORE = "Ollama store"
    OLLAMA_REGISTRY = "Ollama registry"


@dataclass(frozen=True)
class Reference:
    """A resolved MODEL argument."""

    spec: str
    location: str                    # what the reader opens: a path or an http(s) URL (first shard)
    source: Source
    shards: tuple[str, ...] = ()     # every shard's location when the resolution listed them
    mmproj: str | None = None        # the projector llama.cpp would pair with it (companion models)
    warnings: tuple[str, ...] = ()   # e.g. an Ollama blob the pinned llama.cpp cannot load


HF_PREFIXES = ("hf://", "hf.co/", "huggingface.co/")
MS_PREFIXES = ("ms://", "modelscope.cn/")
OLLAMA_PREFIX = "ollama://"
KNOWN_SCHEMES = ("example:", "http://", "https://", "hf://", "ms://", "ollama://")
PATH_SUFFIXES = (".gguf", ".safetensors")

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# hf-cache.cpp:117-141 is_valid_repo_id: [A-Za-z0-9_] runs joined by single '/', '.' or '-'
_REPO_ID = re.compile(r"^[A-Za-z0-9_]+(?:[./-][A-Za-z0-9_]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_.+-]+$")


def is_repo_id(text: str) -> bool:
    return len(text) <= 256 and text.count("/") == 1 and bool(_REPO_ID.match(text))


def parse_repo(hub_name: str, rest: str, spec: str) -> hub.RepoRef:
    """`ORG/REPO[:QUANT][@REV]`, `ORG/REPO@REV/PATH.gguf` or `ORG/REPO/PATH.gguf` (REV may be
    percent-encoded, `refs%2Fpr%2F1`)."""
    parts = rest.strip("/").split("/")
    if len(parts) < 2:
        raise BadInput(f"{spec}: expected ORG/REPO after the scheme")
    seg, file = parts[1], "/".join(parts[2:])
    seg, _, revision = seg.partition("@")
    repo_name, _, tag = seg.partition(":")
    if ":" in revision:                       # REPO@REV:QUANT
        revision, _, tag = revision.partition(":")
    repo = f"{parts[0]}/{repo_name}"
    if not is_repo_id(repo):
        raise BadInput(f"{spec}: {repo!r} is not a repository id (ORG/REPO of letters, digits, '_', '.', '-')")
    if tag and not _TAG.match(tag):
        raise BadInput(f"{spec}: {tag!r} is not a quant tag")
    if file and tag:
        raise BadInput(f"{spec}: name a file or a quant tag, not both")
    if file and not file.endswith(".gguf"):
        raise BadInput(f"{spec}: {file!r} is not a .gguf file (name ORG/REPO[:QUANT] or ORG/REPO/FILE.gguf)")
    return hub.RepoRef(hub_name, repo, tag=tag, file=file, revision=unquote(revision) if revision else None)


def _page_to_file_url(url: str) -> str:
    """A Hub page URL (`/ORG/REPO/blob/REV/FILE`) names the file served at `/ORG/REPO/resolve/REV/FILE`."""
    endpoint = urlsplit(net.current().hf_endpoint)
    parts = urlsplit(url)
    segments = parts.path.split("/")
    if (parts.netloc.lower() == endpoint.netloc.lower() and len(segments) > 5 and segments[3] == "blob"):
        segments[3] = "resolve"
        return parts._replace(path="/".join(segments)).geturl()
    return url


def _repo_reference(spec: str, ref: hub.RepoRef) -> Reference:
    found = hub.locate(ref)
    source = Source.HF_CACHE if found.origin == "cache" else Source.HF if ref.hub == "hf" else Source.MODELSCOPE
    if found.mmproj:
        log.info("%s: llama.cpp would pair it with the projector %s", spec, found.mmproj)
    return Reference(spec, found.shards[0], source, found.shards, found.mmproj)


def _ollama_reference(spec: str, name: ollama.OllamaName, found: ollama.OllamaModel | None = None) -> Reference:
    found = found or ollama.locate(name)
    warnings = tuple(ollama.check_loadable(spec, found))
    source = Source.OLLAMA_STORE if found.origin == "store" else Source.OLLAMA_REGISTRY
    return Reference(spec, found.location, source, (found.location,), found.projector, warnings)


def _bare(spec: str) -> Reference | None:
    """A bare `ORG/REPO[:QUANT]` or a pulled Ollama `NAME[:TAG]`; None leaves the spec a path."""
    if spec.endswith(PATH_SUFFIXES) or spec.startswith((".", "~", os.sep)):
        return None
    head = spec.split(":", 1)[0]
    if is_repo_id(head):
        return _repo_reference(spec, parse_repo("hf", spec, spec))
    if "/" not in spec and os.sep not in spec:
        try:
            name = ollama.parse_name(spec)
        except BadInput:
            return None
        found = ollama.from_store(name)
        if found is not None:
            return _ollama_reference(spec, name, found)
    return None


def _resolve(spec: str) -> Reference:
    if spec.startswith(("http://", "https://")):
        return Reference(spec, _page_to_file_url(spec), Source.URL)
    for prefix in HF_PREFIXES:
        if spec.startswith(prefix):
            return _repo_reference(spec, parse_repo("hf", spec.removeprefix(prefix), spec))
    for prefix in MS_PREFIXES:
        if spec.startswith(prefix):
            return _repo_reference(spec, parse_repo("ms", spec.removeprefix(prefix), spec))
    if spec.startswith(OLLAMA_PREFIX):
        return _ollama_reference(spec, ollama.parse_name(spec.removeprefix(OLLAMA_PREFIX)))
    m = _SCHEME.match(spec)
    if m:
        raise BadInput(f"{spec}: unknown scheme {m.group(1)!r}; MODEL is a path, or one of "
                       f"{', '.join(KNOWN_SCHEMES)}, hf.co/ORG/REPO[:QUANT], or ORG/REPO[:QUANT]")
    return _bare(spec) or Reference(spec, spec, Source.LOCAL)


_memo: dict[tuple[str, net.NetSettings], Reference] = {}


def resolve_reference(spec: str) -> Reference:
    """The MODEL argument resolved (module docstring). `example:` names are examples.py's."""
    if os.path.exists(spec):
        return Reference(spec, spec, Source.LOCAL, mmproj=None)
    key = (spec, net.current())
    if key not in _memo:
        ref = _resolve(spec)
        for warning in ref.warnings:
            log.warning("%s", warning)
        if ref.source is not Source.LOCAL:
            log.debug("%s -> %s (%s)", spec, ref.location, ref.source.value)
        _memo[key] = ref
    return _memo[key]


def forget() -> None:
    """Drop the resolutions made so far (tests that change what a fake server holds)."""
    _memo.clear()
