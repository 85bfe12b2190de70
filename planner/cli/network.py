"""The global options that say how models are fetched: endpoints, token, cache, timeout.

They sit on the app's callback (`fitplan --hf-endpoint URL plan MODEL ...`) and make one
`NetSettings` current for the command that follows (planner.system.net); unset options keep what
the environment says (HF_ENDPOINT, HF_TOKEN, FITPLAN_HEADER_CACHE, ...).
"""
from __future__ import annotations

from typing import Annotated

import typer

from planner import api
from planner.cli.version import Version


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
    settings = api.network_settings(hf_endpoint, ms_endpoint, ollama_registry, token_file, header_cache, http_timeout)
    ctx.with_resource(api.net.use(settings))
