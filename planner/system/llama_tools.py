"""The llama.cpp tools fitplan checks itself against: where they are, building them once, and
running ggml rpc-servers on loopback for peer tests.

The tools are built by scripts/build_llama_cpp.sh into ~/.cache/fitplan/llama.cpp-<version>-portable/bin
(or $FITPLAN_LLAMA_CPP_DIR/bin), from the llama.cpp pinned in DESIGN.md. "portable" is the build:
GGML_NATIVE=OFF, which on x86-64 means AVX2, FMA and F16C and nothing newer, so that every machine
computes the same numbers and runtime/ggml/exact.py can reproduce them.

A second build, "vulkan" (`build_llama_cpp.sh --vulkan`, ~/.cache/fitplan/llama.cpp-<version>-vulkan/bin
or $FITPLAN_LLAMA_CPP_VULKAN_DIR/bin), has ggml-vulkan, so that a real op-offloading device is
there on a machine without a GPU: Mesa's lavapipe, listed once GGML_VK_VISIBLE_DEVICES names it.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from planner.core.errors import FitplanError

log = logging.getLogger(__name__)

LLAMA_CPP_PYTHON_VERSION = "0.3.36"   # DESIGN.md: the pin
LLAMA_CPP_COMMIT = "0c1e570"          # the llama.cpp that sdist vendors
LLAMA_CPP_PIN = f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} (llama.cpp {LLAMA_CPP_COMMIT})"
BUILD_FLAVOR = "portable"             # scripts/build_llama_cpp.sh: GGML_NATIVE=OFF
TOOLS = ("llama-fit-params", "llama-cli", "llama-server", "llama-bench", "ggml-rpc-server",
         "fitplan-dump-nodes")   # the last is ours (scripts/dump_nodes.cpp), linked to the same build
VULKAN_TOOLS = ("llama-fit-params", "llama-cli", "llama-server")
# ggml-vulkan.cpp ggml_vk_instance_init skips CPU-type devices (lavapipe) unless this names them.
VULKAN_ENV = {"GGML_VK_VISIBLE_DEVICES": "0"}
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_llama_cpp.sh"
LOOPBACK = "127.0.0.1"
_BUSY_BUILD_S = 300     # a build whose work dir changed this recently is still running
_START_TIMEOUT_S = 30.0


class ToolsError(FitplanError):
    """The llama.cpp tools could not be found, built or started."""

    exit_code = 1


@dataclass(frozen=True)
class Build:
    """One build of the pinned llama.cpp that scripts/build_llama_cpp.sh makes."""

    flavor: str                 # the cache directory's suffix
    tools: tuple[str, ...]
    script_args: tuple[str, ...]
    dir_env: str                # the environment variable that moves its cache directory


PORTABLE = Build(BUILD_FLAVOR, TOOLS, (), "FITPLAN_LLAMA_CPP_DIR")
VULKAN = Build("vulkan", VULKAN_TOOLS, ("--vulkan",), "FITPLAN_LLAMA_CPP_VULKAN_DIR")


def cache_dir(build: Build = PORTABLE) -> Path:
    env = os.environ.get(build.dir_env)
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fitplan" / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}-{build.flavor}"


def tools_dir(build: Build = PORTABLE) -> Path | None:
    """The bin directory when every tool is there and executable, else None."""
    bin_dir = cache_dir(build) / "bin"
    if all(os.access(bin_dir / tool, os.X_OK) for tool in build.tools):
        return bin_dir
    return None


def _build_in_progress(cache: Path) -> bool:
    """Another build (one not started through ensure_tools) is writing `<cache>.work`; the build
    script starts by deleting that directory, so a second build would wreck the first."""
    work = Path(f"{cache}.work")
    if not work.exists():
        return False
    newest = max((p.stat().st_mtime for p in [work, *work.glob("*")] if p.exists()), default=0.0)
    return time.time() - newest < _BUSY_BUILD_S


def ensure_tools(timeout_s: float = 3600, build: Build = PORTABLE) -> Path:
    """The bin directory, building the tools first if they are missing (one build at a time)."""
    found = tools_dir(build)
    if found:
        return found
    cache = cache_dir(build)
    cache.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with open(f"{cache}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        while tools_dir(build) is None and _build_in_progress(cache) and time.monotonic() < deadline:
            time.sleep(5)
        if tools_dir(build) is None:
            log.info("building the llama.cpp tools into %s", cache)
            env = dict(os.environ, FITPLAN_LLAMA_CPP_DIR=str(cache))
            done = subprocess.run(["bash", str(BUILD_SCRIPT), *build.script_args], env=env,
                                  capture_output=True, text=True,
                                  timeout=max(1.0, deadline - time.monotonic()), check=False)
            if done.returncode != 0:
                tail = " / ".join(done.stderr.strip().splitlines()[-3:]) or "no output"
                raise ToolsError(f"building the llama.cpp tools failed (exit {done.returncode}): {tail}")
    found = tools_dir(build)
    if found is None:
        raise ToolsError(f"the llama.cpp tools are missing from {cache / 'bin'} after the build")
    return found


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def accepts_connections(port: int) -> bool:
    """Something on 127.0.0.1:`port` accepts a TCP connection (a server that has started listening)."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def _start_server(bin_dir: Path, log_dir: Path, env: Mapping[str, str] | None = None,
                  prefix: Sequence[str] = (), args: Sequence[str] = ()) -> tuple[subprocess.Popen, int]:
    """Start one rpc-server on a free loopback port; retry on a port lost to a race. `prefix` runs it
    under another command (`taskset -c 1`), `args` are added to its own."""
    for _attempt in range(5):
        port = free_port()
        with open(log_dir / f"rpc-{port}.log", "w") as out:   # the server keeps its own copy of the fd
            proc = subprocess.Popen([*prefix, str(bin_dir / "ggml-rpc-server"), "-H", LOOPBACK, "-p", str(port),
                                     *args],
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=None if env is None else {**os.environ, **env})
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if accepts_connections(port):
                return proc, port
            time.sleep(0.05)
        stop_process(proc)
    raise ToolsError(f"ggml-rpc-server did not accept connections on {LOOPBACK} (logs in {log_dir})")


def stop_process(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop a process this module (or a caller) started, by its own handle: terminate, then kill."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=grace_s)


@contextlib.contextmanager
def rpc_servers(n: int, bin_dir: Path | None = None, env: Mapping[str, str] | None = None,
                log_dir: Path | None = None, prefix: Callable[[int], Sequence[str]] | None = None,
                args: Sequence[str] = ()) -> Iterator[list[str]]:
    """Run `n` ggml-rpc-servers bound to 127.0.0.1; yields their "127.0.0.1:PORT" endpoints and
    stops each one (by its own process) on exit, also when the body raises. `env`: variables added
    to theirs (GGML_RPC_DEBUG=1 logs every allocation); `log_dir`: where each writes rpc-PORT.log
    (default: a temporary directory removed on exit); `prefix(i)`: the command server i runs under
    (`taskset -c …`); `args`: added to each server's own (`-t 1`)."""
    bin_dir = bin_dir or ensure_tools()
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="fitplan-rpc-") as logs:
        try:
            endpoints = []
            for i in range(n):
                proc, port = _start_server(bin_dir, log_dir or Path(logs), env, prefix(i) if prefix else (), args)
                procs.append(proc)
                endpoints.append(f"{LOOPBACK}:{port}")
            yield endpoints
        finally:
            for proc in procs:
                stop_process(proc)
