"""Fixtures of the peer tests (against real llama.cpp), one instance per test module."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def rpc_endpoints(llama_tools: Path) -> Iterator[list[str]]:
    """Two ggml-rpc-servers on 127.0.0.1 for the module's tests (llama.cpp names them RPC0, RPC1)."""
    from planner.core.llama_tools import rpc_servers

    with rpc_servers(2, llama_tools) as endpoints:
        yield endpoints


@pytest.fixture(scope="module")
def rpc_three(llama_tools: Path) -> Iterator[list[str]]:
    """Three ggml-rpc-servers on 127.0.0.1 (RPC0..RPC2); the architecture matrices use the first two
    for their two-server rows (tests/support/arch_matrix.py)."""
    from planner.core.llama_tools import rpc_servers

    with rpc_servers(3, llama_tools) as endpoints:
        yield endpoints


@pytest.fixture(scope="module")
def shapes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the module writes its shape-faithful sparse GGUFs (planner/synth/shapes.py)."""
    return tmp_path_factory.mktemp("shapes")
