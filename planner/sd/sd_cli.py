"""stable-diffusion.cpp's sd-cli, the ground truth sd-fit is checked against: where the built
binary is, building it once, running it, and reading the buffer sizes its `-v` log states.

scripts/build_sd_cpp.sh builds sd-cli (CPU, GGML_NATIVE=OFF) from the pinned source snapshot into
~/.cache/fitplan/stable-diffusion.cpp-<pin>-cpu/bin (or $FITPLAN_SD_CPP_DIR/bin); with --vulkan, the Vulkan
build into ...-<pin>-vulkan/bin (or $FITPLAN_SD_CPP_VULKAN_DIR/bin), run on Mesa's lavapipe with VULKAN_ENV.

The log lines read (stable-diffusion.cpp at the pin, LOG_DEBUG under `-v`):
  src/core/ggml_extend.hpp `alloc_compute_buffer`: "<runner> compute buffer size: X MB(RAM|VRAM)"
  src/model_manager.cpp: "model manager prepared params backend buffer (X MB, N tensors, <backend>)"
X is bytes / 1024 / 1024 printed with two decimals.
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from planner.core.errors import FitplanError

log = logging.getLogger(__name__)

SD_CPP_PIN = "97d2990-ggml-8e800ce"   # stable-diffusion.cpp 97d29908 with ggml 8e800cef
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_sd_cpp.sh"
DIR_ENV = "FITPLAN_SD_CPP_DIR"
# the builds: backend -> (cache directory suffix, build script arguments, the variable naming another cache)
BUILDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "cpu": ("cpu", (), DIR_ENV),
    "vulkan": ("vulkan", ("--vulkan",), "FITPLAN_SD_CPP_VULKAN_DIR"),
}
# ggml-vulkan.cpp ggml_vk_instance_init skips CPU-type devices (lavapipe) unless this names them
VULKAN_ENV = {"GGML_VK_VISIBLE_DEVICES": "0"}
SOURCE_ENV = "FITPLAN_SD_CPP_SOURCE"


def source_tarball() -> Path:
    """The snapshot scripts/build_sd_cpp.sh builds from: FITPLAN_SD_CPP_SOURCE, or the workspace's
    shared/vendor/ beside this repository (the script's own default)."""
    env = os.environ.get(SOURCE_ENV)
    if env:
        return Path(env)
    return BUILD_SCRIPT.parents[2] / "shared" / "vendor" / f"stable-diffusion.cpp-{SD_CPP_PIN}.tar.xz"
_BUSY_BUILD_S = 300

_COMPUTE = re.compile(r"(?P<runner>\S[^\n]*?) compute buffer size: (?P<mb>[0-9.]+) MB\((?P<where>RAM|VRAM)\)")
_TOTAL = re.compile(r"total params memory size = [^:]*: (?P<parts>[^\n]*)")
_TOTAL_PART = re.compile(r"(?P<name>\w+) (?P<mb>[0-9.]+)MB\((?P<where>[^)]*)\)")
_PARAMS = re.compile(r"prepared params backend buffer \(\s*(?P<mb>[0-9.]+) MB, (?P<n>\d+) tensors, "
                     r"(?P<backend>[^)]+)\)")


class SdCliError(FitplanError):
    """sd-cli could not be found, built or run."""

    exit_code = 1


def _build(backend: str) -> tuple[str, tuple[str, ...], str]:
    if backend not in BUILDS:
        raise SdCliError(f"sd-cli backend {backend!r}: expected one of {', '.join(BUILDS)}")
    return BUILDS[backend]


def cache_dir(backend: str = "cpu") -> Path:
    suffix, _, dir_env = _build(backend)
    env = os.environ.get(dir_env)
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fitplan" / f"stable-diffusion.cpp-{SD_CPP_PIN}-{suffix}"


def sd_cli_path(backend: str = "cpu") -> Path | None:
    exe = cache_dir(backend) / "bin" / "sd-cli"
    return exe if os.access(exe, os.X_OK) else None


def _build_in_progress(cache: Path) -> bool:
    work = Path(f"{cache}.work")
    if not work.exists():
        return False
    newest = max((p.stat().st_mtime for p in [work, *work.rglob("*.o")] if p.exists()), default=0.0)
    return time.time() - newest < _BUSY_BUILD_S


def ensure_sd_cli(timeout_s: float = 3600, backend: str = "cpu") -> Path:
    """sd-cli of the `backend` build, built first if the cache lacks it (one build at a time, also across
    processes)."""
    found = sd_cli_path(backend)
    if found:
        return found
    cache = cache_dir(backend)
    script_args = _build(backend)[1]
    cache.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with open(f"{cache}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        while sd_cli_path(backend) is None and _build_in_progress(cache) and time.monotonic() < deadline:
            time.sleep(5)
        if sd_cli_path(backend) is None:
            log.info("building sd-cli into %s", cache)
            env = dict(os.environ, **{DIR_ENV: str(cache)})
            done = subprocess.run(["bash", str(BUILD_SCRIPT), *script_args], env=env, capture_output=True, text=True,
                                  timeout=max(1.0, deadline - time.monotonic()), check=False)
            if done.returncode != 0:
                tail = " / ".join(done.stderr.strip().splitlines()[-3:]) or "no output"
                raise SdCliError(f"building sd-cli failed (exit {done.returncode}): {tail}")
    found = sd_cli_path(backend)
    if found is None:
        raise SdCliError(f"sd-cli is missing from {cache / 'bin'} after the build")
    return found


def _runner(text: str) -> str:
    """The runner's own name, without the log prefix ("[DEBUG] ggml_extend.hpp:2241 - unet")."""
    return text.rsplit(" - ", 1)[-1].strip()


def _mib_bytes(mb: str) -> int:
    return round(float(mb) * 1024 * 1024)


@dataclass(frozen=True)
class SdCliLog:
    """The buffer sizes one sd-cli run logged. Sizes are bytes, to the 0.01 MiB the log prints."""

    compute: tuple[tuple[str, int], ...] = ()      # (runner description, bytes), in log order
    params: tuple[tuple[str, int, int], ...] = ()  # (backend, bytes, tensors), in log order
    # "total params memory size = ...: text_encoders X MB(RAM), diffusion_model Y MB(RAM), vae Z MB(RAM), ..."
    totals: tuple[tuple[str, int], ...] = ()
    text: str = field(default="", repr=False)

    def compute_of(self, runner: str) -> int:
        """The largest compute buffer logged for `runner` (a runner re-reserves as graphs change)."""
        sizes = [b for name, b in self.compute if name == runner]
        if not sizes:
            raise SdCliError(f"sd-cli logged no compute buffer for {runner!r} "
                             f"(it logged: {', '.join(sorted({n for n, _ in self.compute})) or 'none'})")
        return max(sizes)

    def logged_of(self, runner: str) -> tuple[int, ...]:
        """Every compute buffer logged for `runner`, in log order (one per image of a batch)."""
        return tuple(b for name, b in self.compute if name == runner)


def parse_log(text: str) -> SdCliLog:
    compute = []
    for m in _COMPUTE.finditer(text):
        runner = _runner(m.group("runner"))
        compute.append((runner, _mib_bytes(m.group("mb"))))
    params = [(m.group("backend").strip(), _mib_bytes(m.group("mb")), int(m.group("n")))
              for m in _PARAMS.finditer(text)]
    totals: list[tuple[str, int]] = []
    total = _TOTAL.search(text)
    if total:
        totals = [(p.group("name"), _mib_bytes(p.group("mb"))) for p in _TOTAL_PART.finditer(total.group("parts"))
                  if p.group("where") != "N/A"]
    return SdCliLog(tuple(compute), tuple(params), tuple(totals), text)


def _logged_all(wanted: dict[str, int], line: str) -> bool:
    """Count `line`'s compute buffer off `wanted` (runner -> logs still awaited); True once none are."""
    m = _COMPUTE.search(line)
    runner = _runner(m.group("runner")) if m else None
    if runner in wanted:
        wanted[runner] -= 1
        if wanted[runner] == 0:
            del wanted[runner]
    return not wanted


def run_sd_cli(args: Sequence[str], *, exe: Path | None = None, stop_when: Sequence[str] = (),
               timeout_s: float = 900, log_path: Path | None = None, stop_after: int = 1,
               backend: str = "cpu") -> SdCliLog:
    """Run `sd-cli -v ARGS` of the `backend` build (the Vulkan one with VULKAN_ENV). With `stop_when`, the
    run is stopped (by its own handle) once a compute buffer has been logged for every runner named there,
    as many times as it is named (SD 2.x's UNet runner reserves a small graph first, its v-prediction
    probe), times `stop_after` (a runner re-reserves for each image of a batch: `-b N` logs its buffer N
    times): the sizes are known before the graphs run."""
    exe = exe or ensure_sd_cli(backend=backend)
    cmd = [str(exe), "-v", *args]
    lines: list[str] = []
    wanted = Counter({runner: n * max(stop_after, 1) for runner, n in Counter(stop_when).items()})
    env = dict(os.environ, **VULKAN_ENV) if backend == "vulkan" else None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, errors="replace", env=env)
    deadline = time.monotonic() + timeout_s
    stopped = False
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if wanted and _logged_all(wanted, line):
                stopped = True
                break
            if time.monotonic() > deadline:
                raise SdCliError(f"sd-cli ran past {timeout_s:.0f} s: {' '.join(cmd)}")
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    text = "".join(lines)
    if log_path is not None:
        log_path.write_text(text)
    if not stopped and proc.returncode != 0:
        tail = " / ".join(t.strip() for t in lines[-3:]) or "no output"
        raise SdCliError(f"sd-cli failed (exit {proc.returncode}): {tail}")
    return parse_log(text)
