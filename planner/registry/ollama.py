"""Ollama models: `NAME[:TAG]` to the GGUF blob Ollama keeps for it, locally or in a registry.

A name is `[HOST/][NAMESPACE/]MODEL[:TAG]`, with Ollama's defaults `registry.ollama.ai`, `library`
and `latest`. Ollama stores a pulled model as an OCI-style manifest,
`$OLLAMA_MODELS/manifests/HOST/NAMESPACE/MODEL/TAG`, whose layers name blobs by digest
(`sha256:HEX`, kept as `blobs/sha256-HEX`); the layer with media type
`application/vnd.ollama.image.model` is the GGUF, a `...image.projector` layer the vision projector
(ollama server/images.go, server/internal/manifest). A name not in the local store is looked up in
the registry: `GET /v2/NAMESPACE/MODEL/manifests/TAG` (a Docker v2 manifest), and the blob is
`/v2/NAMESPACE/MODEL/blobs/sha256:HEX`, which the reader reads by Range. A model's tags (for
`fitplan choose ollama://NAME`) are the registry's tag list plus the tags pulled into the store.

Ollama's blobs are not all files the pinned llama.cpp loads: `check_loadable` says which and why.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from planner.core.errors import BadInput, GGUFError, RemoteError
from planner.gguf.pin_lists import pin_architectures
from planner.gguf.reader import ModelFile, read_model
from planner.system import net

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
PROJECTOR_MEDIA_TYPE = "application/vnd.ollama.image.projector"
ADAPTER_MEDIA_TYPE = "application/vnd.ollama.image.adapter"
# models Ollama imports from safetensors for its own engine: one layer per tensor, no GGUF at all
TENSOR_MEDIA_TYPE = "application/vnd.ollama.image.tensor"
MANIFEST_ACCEPT = "application/vnd.docker.distribution.manifest.v2+json"

_DIGEST = re.compile(r"^sha256:([0-9a-fA-F]{64})$")
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]+)?$")


# Tensor-name prefixes of a vision tower and its projector (gguf-py's clip names: v.blk.N..., mm.N...).
VISION_PREFIXES = ("v.", "mm.")


@dataclass(frozen=True)
class OllamaName:
    host: str
    namespace: str
    model: str
    tag: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.model}:{self.tag}" if self.host == DEFAULT_HOST else \
            f"{self.host}/{self.namespace}/{self.model}:{self.tag}"


@dataclass(frozen=True)
class OllamaModel:
    """The model layer's location (blob path or URL) and the projector's, when the manifest has one."""

    location: str
    digest: str
    projector: str | None
    origin: str                  # "store" or "registry"


def parse_name(text: str) -> OllamaName:
    """`qwen3:30b-a3b`, `library/qwen3:30b-a3b`, `NAMESPACE/MODEL:TAG`, `HOST/NAMESPACE/MODEL:TAG`."""
    head, sep, tail = text.rpartition(":")
    rest, tag = (head, tail) if sep and "/" not in tail else (text, "")
    parts = rest.split("/")
    if (not 1 <= len(parts) <= 3 or not all(_PART.match(p) for p in parts[-2:])
            or (len(parts) == 3 and not _HOST.match(parts[0])) or (tag and not _PART.match(tag))):
        raise BadInput(f"ollama://{text}: not an Ollama model name ([HOST/][NAMESPACE/]MODEL[:TAG])")
    host, namespace = DEFAULT_HOST, DEFAULT_NAMESPACE
    if len(parts) == 3:
        host, namespace = parts[0], parts[1]
    elif len(parts) == 2:
        namespace = parts[0]
    return OllamaName(host.lower(), namespace, parts[-1], tag or DEFAULT_TAG)


def _layers(manifest: object, where: str) -> list[dict[str, object]]:
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(layers, list):
        raise BadInput(f"{where}: not an Ollama manifest (no layers)")
    return [layer for layer in layers if isinstance(layer, dict)]


def _digest_of(layers: list[dict[str, object]], media_type: str, where: str) -> str | None:
    for layer in layers:
        if layer.get("mediaType") == media_type:
            digest = layer.get("digest")
            if not isinstance(digest, str) or not _DIGEST.match(digest):
                raise BadInput(f"{where}: layer {media_type} has no sha256 digest ({digest!r})")
            return digest.lower()
    return None


def _model_digest(name: OllamaName, layers: list[dict[str, object]], where: str) -> str:
    digest = _digest_of(layers, MODEL_MEDIA_TYPE, where)
    if digest is not None:
        return digest
    kinds = sorted({str(layer.get("mediaType", "?")).split(";")[0] for layer in layers})
    if any(k.startswith(TENSOR_MEDIA_TYPE) for k in kinds):
        raise BadInput(f"ollama://{name}: stored as per-tensor layers for Ollama's own engine (no GGUF model "
                       f"layer): the pinned llama.cpp cannot load it, and there is no header to plan from")
    raise BadInput(f"ollama://{name}: the manifest has no {MODEL_MEDIA_TYPE} layer (layers: {', '.join(kinds)})")


def blob_path(root: Path, digest: str) -> Path:
    return root / "blobs" / digest.replace(":", "-", 1)


def from_store(name: OllamaName) -> OllamaModel | None:
    """The model from the local store, or None when it is not pulled (or its blob is missing)."""
    root = net.current().ollama_models
    manifest_path = root / "manifests" / name.host / name.namespace / name.model / name.tag
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise BadInput(f"{manifest_path}: unreadable Ollama manifest ({e})") from None
    layers = _layers(manifest, str(manifest_path))
    digest = _model_digest(name, layers, str(manifest_path))
    blob = blob_path(root, digest)
    if not blob.is_file():
        return None                  # a pull still under way; the registry has the blob
    projector = _digest_of(layers, PROJECTOR_MEDIA_TYPE, str(manifest_path))
    proj_blob = blob_path(root, projector) if projector else None
    return OllamaModel(str(blob), digest, str(proj_blob) if proj_blob and proj_blob.is_file() else None, "store")


def registry_base(name: OllamaName) -> str:
    return net.current().ollama_registry if name.host == DEFAULT_HOST else f"https://{name.host}"


def from_registry(name: OllamaName) -> OllamaModel:
    from planner.system import http  # the HTTP stack only when a registry is asked

    base = registry_base(name)
    repo = f"{base}/v2/{name.namespace}/{name.model}"
    manifest_url = f"{repo}/manifests/{name.tag}"
    try:
        manifest = http.get_json(manifest_url, headers={"Accept": MANIFEST_ACCEPT})
    except RemoteError as e:
        if e.status == 404:
            raise BadInput(f"ollama://{name}: no such Ollama model (not in {net.current().ollama_models}, "
                           f"and {base} has no manifest for it)") from None
        if e.status is None:
            raise BadInput(f"ollama://{name}: not in {net.current().ollama_models}, and the Ollama registry "
                           f"{base} cannot be reached ({e.problem}); set FITPLAN_OLLAMA_REGISTRY") from None
        raise
    layers = _layers(manifest, manifest_url)
    digest = _model_digest(name, layers, manifest_url)
    projector = _digest_of(layers, PROJECTOR_MEDIA_TYPE, manifest_url)
    return OllamaModel(f"{repo}/blobs/{digest}", digest, f"{repo}/blobs/{projector}" if projector else None,
                       "registry")


def store_tags(name: OllamaName) -> list[str]:
    """The tags of a model pulled into the local store (its manifests' file names), sorted."""
    folder = net.current().ollama_models / "manifests" / name.host / name.namespace / name.model
    try:
        return sorted(p.name for p in folder.iterdir() if p.is_file() and _PART.match(p.name))
    except OSError:
        return []


def registry_tags(name: OllamaName) -> list[str]:
    """A model's tags from its registry's tag list (the Docker v2 `GET /v2/NAMESPACE/MODEL/tags/list`),
    in the registry's order."""
    from planner.system import http

    base = registry_base(name)
    url = f"{base}/v2/{name.namespace}/{name.model}/tags/list"
    try:
        doc = http.get_json(url)
    except RemoteError as e:
        if e.status == 404:
            return []
        if e.status is None:
            raise BadInput(f"ollama://{name.namespace}/{name.model}: the Ollama registry {base} cannot be reached "
                           f"({e.problem}); set FITPLAN_OLLAMA_REGISTRY, or name the tags") from None
        raise
    tags = doc.get("tags") if isinstance(doc, dict) else None
    if not isinstance(tags, list):
        raise BadInput(f"{url}: not a tag list (no \"tags\")")
    return [t for t in tags if isinstance(t, str) and _PART.match(t)]


def list_tags(name: OllamaName) -> list[str]:
    """Every tag of a model: the registry's, then any pulled tag it does not list."""
    tags = registry_tags(name)
    tags += [t for t in store_tags(name) if t not in tags]
    if not tags:
        raise BadInput(f"ollama://{name.namespace}/{name.model}: no such Ollama model (no tag in "
                       f"{net.current().ollama_models}, none listed by {registry_base(name)})")
    return tags


def locate(name: OllamaName) -> OllamaModel:
    """The local store first, then the registry."""
    return from_store(name) or from_registry(name)


def loadability_warnings(model: ModelFile) -> list[str]:
    """Why the pinned llama.cpp would refuse a GGUF Ollama runs with its own engine ([] when none)."""
    out = []
    if model.architecture and model.architecture not in pin_architectures():
        out.append(f"its architecture {model.architecture!r} is not one the pinned llama.cpp knows: "
                   f"it stops with \"unknown model architecture\"")
    vision = [t.name for t in model.tensors if t.name.startswith(VISION_PREFIXES)]
    if vision:
        out.append(f"it holds {len(vision)} vision tensors (e.g. {vision[0]}) in the model file, as Ollama packs "
                   f"them; llama.cpp creates only its architecture's tensors and stops with \"wrong number of "
                   f"tensors\" (src/llama-model-loader.cpp:1398): it needs the text model and an mmproj file apart")
    return out


def check_loadable(spec: str, model: OllamaModel) -> list[str]:
    """Read the blob's header (the header cache keeps a remote one) and say what llama.cpp would
    refuse; a blob that is not GGUF at all is an error, since there is nothing to plan from."""
    try:
        header = read_model(model.location, require_architecture=False)
    except GGUFError as e:
        raise BadInput(f"{spec}: the model blob {model.digest[:19]}... is not a GGUF the pinned llama.cpp can "
                       f"load ({e.problem})") from None
    return [f"{spec}: {w}" for w in loadability_warnings(header)]
