"""Where remote models are looked up and how the network is used: one settings object.

Every base URL and cache directory is a setting, read from the environment (the variables the
tools users already run honour: MODEL_ENDPOINT/HF_ENDPOINT, HF_TOKEN, HF_HUB_CACHE, LLAMA_CACHE, OLLAMA_MODELS)
and overridable from the command line, so mirrors work and tests point everything at loopback
and temporary directories. Nothing here opens a connection.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from planner.core.errors import BadInput
from planner.core.units import MiB


def _cache_home(env: Mapping[str, str]) -> Path:
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def fitplan_cache(env: Mapping[str, str] | None = None) -> Path:
    """fitplan's own cache directory: FITPLAN_CACHE, else $XDG_CACHE_HOME/fitplan (~/.cache/fitplan)."""
    env = os.environ if env is None else env
    return Path(env.get("FITPLAN_CACHE") or _cache_home(env) / "fitplan")


@dataclass(frozen=True)
class NetSettings:
    hf_endpoint: str            # HF_ENDPOINT; the Hub's API and file host
    ms_endpoint: str            # MODELSCOPE_ENDPOINT; ModelScope's API and file host
    ollama_registry: str        # FITPLAN_OLLAMA_REGISTRY; an OCI registry serving Ollama models
    ollama_models: Path         # OLLAMA_MODELS; the local Ollama store (manifests/, blobs/)
    hf_hub_cache: Path          # HF_HUB_CACHE (or HF_HOME/hub); huggingface_hub's snapshot cache
    llama_cache: Path           # LLAMA_CACHE; where llama.cpp's -hf keeps its downloads
    header_cache: Path          # FITPLAN_HEADER_CACHE; fitplan's own header cache
    header_cache_bytes: int     # FITPLAN_HEADER_CACHE_MIB; the header cache's size bound
    header_cap_bytes: int       # FITPLAN_HEADER_CAP_MIB; a header larger than this is refused
    token: str | None = None    # HF_TOKEN (else the stored login token), or the contents of --token-file
    timeout_s: float = 30.0     # FITPLAN_HTTP_TIMEOUT; connect/read timeout of one request
    retries: int = 3            # FITPLAN_HTTP_RETRIES; retries of a failed request, with backoff


def from_environment(env: Mapping[str, str] | None = None) -> NetSettings:
    """The settings the environment describes (os.environ by default)."""
    env = os.environ if env is None else env
    cache = _cache_home(env)
    hf_home = Path(env.get("HF_HOME") or cache / "huggingface")
    own = fitplan_cache(env)
    try:
        return NetSettings(
            # the pinned llama.cpp reads MODEL_ENDPOINT before HF_ENDPOINT (common.cpp common_get_model_endpoint)
            hf_endpoint=(env.get("MODEL_ENDPOINT") or env.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/"),
            ms_endpoint=(env.get("MODELSCOPE_ENDPOINT") or "https://www.modelscope.cn").rstrip("/"),
            ollama_registry=(env.get("FITPLAN_OLLAMA_REGISTRY") or "https://registry.ollama.ai").rstrip("/"),
            ollama_models=Path(env.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models"),
            hf_hub_cache=Path(env.get("HF_HUB_CACHE") or hf_home / "hub"),
            llama_cache=Path(env.get("LLAMA_CACHE") or cache / "llama.cpp"),
            header_cache=Path(env.get("FITPLAN_HEADER_CACHE") or own / "headers"),
            header_cache_bytes=int(float(env.get("FITPLAN_HEADER_CACHE_MIB") or 1024) * MiB),
            header_cap_bytes=int(float(env.get("FITPLAN_HEADER_CAP_MIB") or 256) * MiB),
            token=(env.get("HF_TOKEN") or "").strip() or _stored_token(env, hf_home),
            timeout_s=float(env.get("FITPLAN_HTTP_TIMEOUT") or 30.0),
            retries=int(env.get("FITPLAN_HTTP_RETRIES") or 3),
        )
    except ValueError as e:
        raise BadInput(f"a FITPLAN_* network setting is not a number: {e}") from None


def _stored_token(env: Mapping[str, str], hf_home: Path) -> str | None:
    """The token `hf auth login` stored (HF_TOKEN_PATH, else HF_HOME/token), as huggingface_hub
    itself falls back to it; read only, never written."""
    try:
        text = Path(env.get("HF_TOKEN_PATH") or hf_home / "token").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def read_token_file(path: str | os.PathLike[str]) -> str:
    """A bearer token from a file (its first non-empty line), for --token-file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise BadInput(f"--token-file {path}: {e.strerror or e}") from None
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    raise BadInput(f"--token-file {path}: the file holds no token")


_current: NetSettings | None = None


def current() -> NetSettings:
    """The settings in force: those the CLI set with `use`, else the environment's."""
    return _current if _current is not None else from_environment()


@contextlib.contextmanager
def use(settings: NetSettings) -> Iterator[NetSettings]:
    """Make `settings` current for the duration (the CLI's global options; tests)."""
    global _current
    before = _current
    _current = settings
    try:
        yield settings
    finally:
        _current = before


def overridden(**changes: Any) -> NetSettings:
    """The current settings with some fields replaced (None values leave a field as it is)."""
    return replace(current(), **{k: v for k, v in changes.items() if v is not None})
