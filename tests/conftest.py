"""Shared pytest fixtures. Several developers add fixtures here: append, do not reorder."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def llama_tools() -> Path:
    """The bin directory of the pinned llama.cpp tools, built once if missing (peer tests)."""
    from planner.system.llama_tools import ensure_tools

    return ensure_tools()


@pytest.fixture
def rpc_pair(llama_tools: Path) -> Iterator[list[str]]:
    """Two ggml-rpc-servers on 127.0.0.1; yields their "127.0.0.1:PORT" endpoints, stops them after."""
    from planner.system.llama_tools import rpc_servers

    with rpc_servers(2, llama_tools) as endpoints:
        yield endpoints


@pytest.fixture(scope="session")
def llama_vulkan_tools() -> Path:
    """The bin directory of the pinned llama.cpp built with ggml-vulkan (scripts/build_llama_cpp.sh
    --vulkan), built once if missing; run its tools with llama_tools.VULKAN_ENV to see lavapipe."""
    from planner.system.llama_tools import VULKAN, ensure_tools

    return ensure_tools(build=VULKAN)


@pytest.fixture
def http_servers() -> Iterator[object]:
    """Start loopback HTTP servers with `http_servers.start(ranges=, lengths=, token=)`
    (tests/support/http_server.py); all are stopped after the test."""
    from tests.support.http_server import ServerPool

    with ServerPool() as pool:
        yield pool


@pytest.fixture
def net_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """Network settings with every cache under tmp_path, no token, one retry: set in the
    environment, which `net.current()` reads on every call (so a test's later monkeypatch.setenv
    applies too). Yields the settings as they stand at the start."""
    from planner.system import net

    env = {"FITPLAN_HEADER_CACHE": str(tmp_path / "cache" / "headers"), "HF_HUB_CACHE": str(tmp_path / "cache" / "hub"),
           "LLAMA_CACHE": str(tmp_path / "cache" / "llama.cpp"), "OLLAMA_MODELS": str(tmp_path / "ollama"),
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "cache" / "huggingface"),
           "FITPLAN_HTTP_RETRIES": "1", "FITPLAN_HTTP_TIMEOUT": "10"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in ("HF_TOKEN", "HF_TOKEN_PATH", "HF_ENDPOINT", "MODEL_ENDPOINT", "MODELSCOPE_ENDPOINT",
              "FITPLAN_OLLAMA_REGISTRY", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy",
              "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(k, raising=False)
    yield net.from_environment()


@pytest.fixture(scope="session")
def remote_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Sparse models written once per session to serve over loopback HTTP: "llama-70b" (~40 GiB
    logical), "gemma2-9b" (a 256k vocabulary), "split" (llama-70b as 3 gguf-split shards, first shard)."""
    from tests.support.remote_models import BIG_VOCAB, big_vocab, llama_70b

    d = tmp_path_factory.mktemp("remote-models")
    [seventy] = llama_70b(d)
    split = llama_70b(d, shards=3)
    return {"llama-70b": seventy, BIG_VOCAB: big_vocab(d), "split": split[0]}
