"""Fixtures of the peer tests (against real llama.cpp), one instance per test module."""
from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner.hardware.vulkan_devices import LAVAPIPE
from planner.sd.sd_cli import ensure_sd_cli, sd_cli_path, source_tarball
from planner.system.llama_tools import VULKAN_ENV

MIB = 2**20


@pytest.fixture(scope="module")
def rpc_endpoints(llama_tools: Path) -> Iterator[list[str]]:
    """Two ggml-rpc-servers on 127.0.0.1 for the module's tests (llama.cpp names them RPC0, RPC1)."""
    from planner.system.llama_tools import rpc_servers

    with rpc_servers(2, llama_tools) as endpoints:
        yield endpoints


@pytest.fixture(scope="module")
def rpc_three(llama_tools: Path) -> Iterator[list[str]]:
    """Three ggml-rpc-servers on 127.0.0.1 (RPC0..RPC2); the architecture matrices use the first two
    for their two-server rows (tests/support/arch_matrix.py)."""
    from planner.system.llama_tools import rpc_servers

    with rpc_servers(3, llama_tools) as endpoints:
        yield endpoints


@pytest.fixture(scope="module")
def shape_files() -> dict:
    """A module's shape-faithful files and their contexts, each written on first use
    (tests/support/arch_matrix.shape_file)."""
    return {}


@pytest.fixture(scope="module")
def shapes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the module writes its shape-faithful sparse GGUFs (planner/synth/shapes_common.py)."""
    return tmp_path_factory.mktemp("shapes")


@pytest.fixture(scope="module")
def lavapipe(llama_vulkan_tools: Path) -> Path:
    """The Vulkan build's bin directory, once llama.cpp lists lavapipe as Vulkan0."""
    done = subprocess.run([str(llama_vulkan_tools / "llama-cli"), "--list-devices"], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, **VULKAN_ENV), check=False)
    listed = re.search(r"^\s*Vulkan0: (.*) \((\d+) MiB, (\d+) MiB free\)", done.stdout + done.stderr, re.MULTILINE)
    if listed is None:   # scripts/test_deps.sh installs lavapipe: its absence is a failure, never a skip
        pytest.fail("llama.cpp lists no Vulkan device: scripts/test_deps.sh installs Mesa's lavapipe "
                    "(apt-get install mesa-vulkan-drivers)")
    if LAVAPIPE.match not in listed.group(1):
        # a machine whose own GPU's Vulkan driver lists it first: the figures below are lavapipe's
        pytest.skip(f"Vulkan0 is {listed.group(1)} here, not Mesa's lavapipe")
    assert int(listed.group(2)) * MIB == LAVAPIPE.heap_bytes
    return llama_vulkan_tools


@pytest.fixture(scope="session")
def sd_cli() -> Path:
    """sd-cli built from the vendored stable-diffusion.cpp snapshot (on first use), for the sd peer modules."""
    if sd_cli_path() is None and not source_tarball().is_file():
        pytest.skip(f"sd-cli is not built and its source snapshot {source_tarball()} is absent "
                    "(set FITPLAN_SD_CPP_SOURCE to the stable-diffusion.cpp-97d2990-ggml-8e800ce tarball)")
    return ensure_sd_cli()
