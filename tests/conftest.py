"""Shared pytest fixtures. Several developers add fixtures here: append, do not reorder."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def llama_tools() -> Path:
    """The bin directory of the pinned llama.cpp tools, built once if missing (peer tests)."""
    from planner.core.llama_tools import ensure_tools

    return ensure_tools()


@pytest.fixture
def rpc_pair(llama_tools: Path) -> Iterator[list[str]]:
    """Two ggml-rpc-servers on 127.0.0.1; yields their "127.0.0.1:PORT" endpoints, stops them after."""
    from planner.core.llama_tools import rpc_servers

    with rpc_servers(2, llama_tools) as endpoints:
        yield endpoints


@pytest.fixture(scope="session")
def llama_vulkan_tools() -> Path:
    """The bin directory of the pinned llama.cpp built with ggml-vulkan (scripts/build_llama_cpp.sh
    --vulkan), built once if missing; run its tools with llama_tools.VULKAN_ENV to see lavapipe."""
    from planner.core.llama_tools import VULKAN, ensure_tools

    return ensure_tools(build=VULKAN)
