"""The global options that say how models are fetched: endpoints, token, cache, timeout.

They sit on the app's callback (`fitplan --hf-endpoint URL plan MODEL ...`) and make one
`NetSettings` current for the command that follows (planner.system.net); unset options keep what
the environment says (HF_ENDPOINT, HF_TOKEN, FITPLAN_HEADER_CACHE, ...).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from planner.cli.version import Version
from planner.core.errors import BadInput
from planner.system import net


def _url(option: str, value: str | None) -> str | None:
    if value is None:
        return None
    if not value.lower().startswith(("http://", "https://")):
        raise BadInput(f"{option} {value!r}: expected an http:// or https:// URL")
    return value.rstrip("/")


def network_settings(hf_endpoint: str | None = None, ms_endpoint: str | None = None,
                     ollama_registry: str | None = None, token_file: str | None = None,
                     header_cache: str | None = None, http_timeout: float | None = None) -> net.NetSettings:
    """The current settings with the command line's choices applied."""
    if http_timeout is not None and http_timeout <= 0:
        raise BadInput(f"--http-timeout {http_timeout:g}: expected a positive number of seconds")
    return net.overridden(
        hf_endpoint=_url("--hf-endpoint", hf_endpoint), ms_endpoint=_url("--ms-endpoint", ms_endpoint),
        ollama_registry=_url("--ollama-registry", ollama_registry),
        token=net.read_token_file(token_file) if token_file else None,
        header_cache=Path(header_cache) if header_cache else None, timeout_s=http_timeout)


def root_callback(
    ctx: typer.Context,
    hf_endpoint: Annotated[str | None, typer.Option(
        "--hf-endpoint", help="Hugging Face endpoint (default: HF_ENDPOINT, else https://huggingface.co)")] = None,
    ms_endpoint: Annotated[str | None, typer.Option(
        "--ms-endpoint", help="ModelScope endpoint (default: MODELSCOPE_ENDPOINT)")] = None,
    ollama_registry: Annotated[str | None, typer.Option(
        "--ollama-registry", help="Ollama registry (default: FITPLAN_OLLAMA_REGISTRY)")] = None,
    token_file: Annotated[str | None, typer.Option(
        "--token-file", help="a file holding the bearer token for gated repositories (default: HF_TOKEN)")] = None,
    header_cache: Annotated[str | None, typer.Option(
        "--header-cache", help="directory of the remote-header cache (default: ~/.cache/fitplan/headers)")] = None,
    http_timeout: Annotated[float | None, typer.Option(
        "--http-timeout", help="seconds one HTTP request may take (default: 30)")] = None,
    version: Version = False,   # eager: prints and exits before anything else (planner/cli/version.py)
) -> None:
    """Placement planner and auto-fit advisor for ggml engines."""
    settings = network_settings(hf_endpoint, ms_endpoint, ollama_registry, token_file, header_cache, http_timeout)
    ctx.with_resource(net.use(settings))
