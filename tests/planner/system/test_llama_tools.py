"""Locating the llama.cpp tools (no build needed)."""
from __future__ import annotations

import os
from pathlib import Path

from planner.system import llama_tools


def fake_tools(root: Path, names) -> None:
    (root / "bin").mkdir(parents=True)
    for name in names:
        path = root / "bin" / name
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)


def test_env_dir_with_every_tool(tmp_path, monkeypatch):
    fake_tools(tmp_path, llama_tools.TOOLS)
    monkeypatch.setenv("FITPLAN_LLAMA_CPP_DIR", str(tmp_path))
    assert llama_tools.tools_dir() == tmp_path / "bin"
    assert llama_tools.ensure_tools() == tmp_path / "bin"      # present: nothing is built


def test_a_missing_tool_means_not_built(tmp_path, monkeypatch):
    fake_tools(tmp_path, [t for t in llama_tools.TOOLS if t != "ggml-rpc-server"])
    monkeypatch.setenv("FITPLAN_LLAMA_CPP_DIR", str(tmp_path))
    assert llama_tools.tools_dir() is None


def test_default_cache_follows_the_pin(monkeypatch, tmp_path):
    monkeypatch.delenv("FITPLAN_LLAMA_CPP_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert llama_tools.cache_dir() == tmp_path / "fitplan" / "llama.cpp-0.3.36-portable"


def test_free_port_is_bindable_on_loopback():
    import socket

    port = llama_tools.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert 0 < port < 65536 and os.name == "posix"


def test_vulkan_build_has_its_own_cache_and_tools(monkeypatch, tmp_path):
    monkeypatch.delenv("FITPLAN_LLAMA_CPP_VULKAN_DIR", raising=False)
    monkeypatch.delenv("FITPLAN_LLAMA_CPP_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    vulkan = tmp_path / "fitplan" / "llama.cpp-0.3.36-vulkan"
    assert llama_tools.cache_dir(llama_tools.VULKAN) == vulkan
    fake_tools(vulkan, ["llama-fit-params", "llama-cli", "llama-server"])   # no rpc-server, no node dump
    assert llama_tools.tools_dir(llama_tools.VULKAN) == vulkan / "bin"
    assert llama_tools.ensure_tools(build=llama_tools.VULKAN) == vulkan / "bin"
    assert llama_tools.tools_dir() is None    # the CPU build is another directory
