"""Hostile inputs against the real CLI: GGUF headers and split shards, safetensors headers,
inventory YAML, llama.cpp flag lists, sd-fit assignment strings, output paths and special files.

Every input runs `planner.cli.main` in a forked worker of this process (a fork server: planner is
imported and warmed once; a fresh interpreter costs 0.3-0.4 s here), under a 10 s time limit and an
address-space limit (RLIMIT_AS: 1 GiB; validate runs: 1.5 x the model file, at least 1 GiB), and is
classified: ok / traceback / hang / memory / wrong exit / unclear message / partial file. A sample is
re-run as real subprocesses (`python -m planner.cli`), which must classify the same. Seeded and
deterministic: input i of seed s is the same on every run.

    python -m tests.fuzz.fuzz_inputs --count 5000 [--seed 0] [--jobs 2] [--sample 50] [--json out.json]
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import io
import json
import os
import random
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import typer
import yaml

from planner.synth.gguf_factory import add_tokenizer, gemma3_spec, granitehybrid_spec, llama_spec, qwen3moe_spec
from planner.synth.gguf_fields import Gguf, load
from tests.fuzz.fuzz_gguf import GGUF_LIES, GGUF_WEIGHTS, safetensors_lie, safetensors_valid, split_lie

TIME_LIMIT_S = 10.0
AS_LIMIT = 1 << 30
ANY = frozenset({0, 1, 2})
REFUSE = frozenset({2})
CLASSES = ("ok", "traceback", "hang", "memory", "wrong exit", "unclear message", "partial file")
MAX_LINE = 300          # an error line longer than this quotes too much of what it refuses
NOBODY = 65534


@dataclass(frozen=True)
class Case:
    index: int
    source: str
    what: str
    argv: tuple[str, ...]
    expect: frozenset[int]
    directory: str
    as_limit: int = AS_LIMIT
    output: str | None = None      # a file the command may write: complete or absent afterwards
    as_nobody: bool = False        # run unprivileged (read-only directories mean nothing to root)


@dataclass
class Result:
    case: Case
    cls: str
    rc: int | None
    wall_s: float
    rss_kib: int
    stderr_tail: str
    location: str = ""             # the deepest project frame of a traceback, and its exception


@dataclass
class Bases:
    """Valid models written once with gguf-py, parsed into fields for the lies."""

    directory: Path
    models: dict[str, Gguf] = field(default_factory=dict)
    model_paths: dict[str, Path] = field(default_factory=dict)
    shards: list[Gguf] = field(default_factory=list)
    safetensors: Path | None = None


def write_bases(directory: Path) -> Bases:
    b = Bases(directory)
    specs = {"llama": llama_spec(), "gemma3": gemma3_spec(), "qwen3moe": qwen3moe_spec(),
             "granitehybrid": granitehybrid_spec()}
    add_tokenizer(specs["llama"], 1000, n_merges=1)
    for name, spec in specs.items():
        [path] = spec.write(directory / f"{name}.gguf")
        b.models[name], b.model_paths[name] = load(path), path
    shards = llama_spec(n_layer=2).write(directory / "split.gguf", shards=2)
    b.shards = [load(p) for p in shards]
    b.safetensors = safetensors_valid(directory / "base.safetensors")
    return b


# --- generators: each makes one case in its directory ----------------------------------------------

def _gguf_command(rng: random.Random, model: Path) -> tuple[tuple[str, ...], int]:
    r = rng.random()
    m = str(model)
    if r < 0.45:
        return ("inspect", m), AS_LIMIT
    if r < 0.75:
        return ("estimate", m, "--format", "json", "--", "-c", "512"), AS_LIMIT
    if r < 0.92:
        return ("plan", m, "--device", "CUDA0=1GiB", "--ram", "4GiB"), AS_LIMIT
    if r < 0.96:
        return ("fetch-header", m, "-o", str(model.parent / "header-only.gguf")), AS_LIMIT
    return ("validate", m), max(AS_LIMIT, int(1.5 * model.stat().st_size))


def gen_gguf(rng: random.Random, b: Bases, d: Path, i: int) -> Case:
    base = rng.choice(sorted(b.models))
    g = load(b.model_paths[base])
    lie = rng.choices(list(GGUF_WEIGHTS), weights=list(GGUF_WEIGHTS.values()))[0]
    made = GGUF_LIES[lie](rng, g, d / "m.gguf")
    argv, limit = _gguf_command(rng, made.path)
    # fetch-header copies a header without reading the model's facts: a missing key is no error there
    refuse = made.must_refuse and not (lie == "missing_key" and argv[0] == "fetch-header")
    return Case(i, "gguf", f"{base}: {made.what}", argv, REFUSE if refuse else ANY, str(d), limit)


def gen_split(rng: random.Random, b: Bases, d: Path, i: int) -> Case:
    made = split_lie(rng, b.shards, d)
    argv, limit = _gguf_command(rng, made.path)
    return Case(i, "split", made.what, argv, REFUSE if made.must_refuse else ANY, str(d), limit)


def gen_safetensors(rng: random.Random, b: Bases, d: Path, i: int) -> Case:
    made = safetensors_lie(rng, d / "m.safetensors")
    argv = ("sd-fit", str(made.path), "--format", "json", "--device", "CUDA0=8GiB", "--ram", "16GiB")
    return Case(i, "safetensors", made.what, argv, REFUSE if made.must_refuse else ANY, str(d))


def _laughs(levels: int) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for k in range(1, levels):
        prev, cur = chr(ord("a") + k - 1), chr(ord("a") + k)
        lines.append(f"{cur}: &{cur} [{','.join(['*' + prev] * 9)}]")
    lines.append(f"host: {{ram: *{chr(ord('a') + levels - 1)}}}")
    return "\n".join(lines) + "\n"


_YAML_REFUSE = [  # (path into the document, value): each must be refused
    (("hots",), {"ram": "64GiB"}), (("devices", 0, "memroy"), "24GiB"), (("devices", 0, "bandwidth_gbs"), float("inf")),
    (("devices", 0, "bandwidth_gbs"), float("nan")), (("host", "bandwidth_gbs"), -float("inf")),
    (("devices", 0, "bandwidth_gbs"), "fast"), (("devices", 0, "memory"), "٨GiB"), (("host", "ram"), "٣٢GiB"),
    (("devices", 0, "name"), "CUDA٠"), (("devices", 0, "count"), -1), (("devices", 0, "count"), 2.5),
    (("devices", 0, "memory"), "-1GiB"), (("devices", 0, "free"), "nan GiB"), (("devices", 0, "name"), ""),
    (("devices", 0, "bandwidth_gbs"), [1]), (("devices", 0, "link_gbs"), float("nan")), (("host",), [1, 2]),
    (("devices", 0, "catalog"), ["rtx3090"]), (("devices", 0, "memory"), "9" * 400 + "GiB"),
]
_YAML_ANY = [
    (("devices", 0, "bandwidth_gbs"), 1e308), (("devices", 0, "count"), 10**9), (("devices", 0, "count"), 10**6),
    (("devices", 0, "count"), 10**30), (("devices", 0, "memory"), 1e308), (("devices", 0, "memory"), "1e308GiB"),
    (("devices", 0, "name"), "x" * 5000), (("devices", 0, "catalog"), "nope"), (("devices", 0, "link"), "pcie99x99"),
    (("devices", 0, "endpoint"), "host:99999"), (("host", "ram"), 0), (("devices", 0, "count"), 0),
]


def _yaml_doc(rng: random.Random) -> tuple[str, bool, str]:
    doc: dict = {"host": {"ram": "64GiB", "available": "60GiB"},
                 "devices": [{"name": "CUDA0", "memory": "24GiB", "free": "23GiB", "bandwidth_gbs": 900}]}
    r = rng.random()
    if r < 0.08:
        return _laughs(rng.choice([4, 9])), True, "billion laughs"
    if r < 0.12:
        depth = rng.choice([1000, 20000])
        return "host: " + "[" * depth + "]" * depth + "\n", True, f"nesting {depth}"
    if r < 0.16:
        text = rng.choice(["", "- 1\n- 2\n", "just a string\n", "\x00\xff\xfe", "host: {ram: 64GiB\n"])
        return text, True, "not a mapping"
    table = _YAML_REFUSE if r < 0.6 else _YAML_ANY
    where, value = rng.choice(table)
    node = doc
    for k in where[:-1]:
        node = node[k]
    node[where[-1]] = value
    what = f"{'.'.join(map(str, where))} = {str(value)[:40]}"
    return yaml.safe_dump(doc, allow_unicode=True), table is _YAML_REFUSE, what


def gen_yaml(rng: random.Random, b: Bases, d: Path, i: int) -> Case:
    text, refuse, what = _yaml_doc(rng)
    path = d / "inv.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    if rng.random() < 0.5:
        argv: tuple[str, ...] = ("devices", "--devices", str(path), "--no-llama", "--format", "json")
    else:
        argv = ("plan", str(b.model_paths["llama"]), "--devices", str(path))
    return Case(i, "yaml", what, argv, REFUSE if refuse else ANY, str(d))


_FLAGS_REFUSE = [["-ctk", ""], ["--cache-type-k", "bogus"], ["-ctv", "f16,bogus"], ["-c", "nan"], ["-c", "٨"],
                 ["-ts", "nan,1"], ["-ot", "[=CPU"], ["-ot", "exps=NOPE"],
                 ["-ot", "(" * 5000 + "x" + ")" * 5000 + "=CPU"],
                 ["--bogus-flag"], ["-c", "-5"], ["-ngl", "abc"], ["-sm", "bogus"], ["-fa", "maybe"]]
_FLAGS_ANY = [["-ncmoe", "1000000"], ["-ncmoe", "100000000"], ["--n-cpu-moe", str(2**63)], ["-ncffn", "100000000"],
              ["-ot", "(.*)*x=CPU"], ["-ot", "(a+)+$=CPU"], ["-ot", "([a-z]+)*blk=CPU"], ["-ot", "x{1000000}=CPU"],
              ["-ot", ",".join(["exps=CPU"] * 3000)], ["-c", str(2**63)], ["-c", "100000000000"], ["-c", "0"],
              ["-ngl", "99999999999999999999"], ["-ngl", "-5"], ["-ts", "inf"], ["-ts", ",".join(["1"] * 10000)],
              ["-ts", "-1,2"], ["-ub", "0"], ["-b", "0"], ["-np", "1000000"], ["-np", "0"], ["-mg", "99"],
              ["--rpc", "a" * 5000], ["-dev", "none"], ["-dev", "CUDA9"], ["-ctk", "q4_0"], ["-cmoe"],
              ["-ot", "exps=CPU"]]


def gen_flags(rng: random.Random, b: Bases, d: Path, i: int) -> Case:
    refuse = rng.random() < 0.35
    pieces = [rng.choice(_FLAGS_REFUSE)] if refuse else []
    pieces += [rng.choice(_FLAGS_ANY) for _ in range(rng.randint(0 if refuse else 1, 2))]
    rng.shuffle(pieces)
    flags = [f for p in pieces for f in p]
    model = b.model_paths[rng.choice(["llama", "qwen3moe"])]
    argv = ("estimate", str(model), "--format", "json", "--", *flags)
    return Case(i, "flags", " ".join(f[:30] for f in flags)[:120], argv, REFUSE if refuse else ANY, str(d))


_SD_REFUSE = [["--backend", "vae=cuda0&cuda1"], ["--backend", "=cuda0"], ["--backend", "a=b=c"], ["--backend", "cuda٠"],
              ["--max-vram", ""], ["--max-vram", "cuda0=٨"], ["--max-vram", "nan"], ["--max-vram", "9" * 400],
              ["--split-mode", "diffusion=col"], ["--auto-fit", "maybe"], ["--steps", "-1"], ["--backend", "x" * 5000],
              ["--params-backend", "bogus"]]
_SD_ANY = [["--backend", "te="], ["--backend", "diffusion=cuda0&&"],
           ["--backend", "&".join(f"cuda{k}" for k in range(3000))],
           ["--backend", ",,,"], ["--backend", "te=cpu,te=cuda0"], ["--params-backend", "disk,disk"],
           ["--params-backend", "te=disk&cuda0"], ["--max-vram", "1e308"], ["--max-vram", "-inf"],
           ["--max-vram", "cuda0=6,cuda0=7"], ["--steps", "1000000000000000000"], ["--steps", "0"], ["--optimal"],
           ["--backend", "diffusion=cuda0&cuda0"]]


def gen_sdfit(rng: random.Random, b: Bases, d: Path, i: int) -> Case:
    refuse = rng.random() < 0.45
    pieces = [rng.choice(_SD_REFUSE)] if refuse else [rng.choice(_SD_ANY)]
    device = rng.choice(["CUDA0=8GiB", "2xrtx3090", "300xrtx3090"]) if ["--optimal"] in pieces else "CUDA0=8GiB"
    flags = [f for p in pieces for f in p]
    argv = ("sd-fit", str(b.safetensors), "--format", "json", "--device", device, "--ram", "16GiB", *flags)
    return Case(i, "sd-fit", " ".join(argv[7:])[:120], argv, REFUSE if refuse else ANY, str(d))


def gen_output(rng: random.Random, b: Bases, d: Path, i: int) -> Case:
    """-o naming what cannot be written. These run as `nobody`: as root, a rename over /dev/full
    replaces the device node (it did once here), and / and . are writable."""
    kind = rng.choice(["ok", "dir", "root", "dot", "readonly", "long", "too_long", "empty", "missing", "dev_full",
                       "fifo"])
    target = {"ok": "plan.yaml", "dir": "outdir", "root": "/", "dot": ".", "readonly": "ro/plan.yaml",
              "long": "p" * 250, "too_long": "p" * 300 + ".yaml", "empty": "", "missing": "missing/sub/plan.yaml",
              "dev_full": "/dev/full", "fifo": "fifo.yaml"}[kind]
    os.chmod(d, 0o777)
    if kind == "dir":
        (d / "outdir").mkdir(mode=0o777)
    if kind == "readonly":
        (d / "ro").mkdir(mode=0o555)
    if kind == "fifo":
        os.mkfifo(d / "fifo.yaml", 0o666)
    out = str(d / target) if target and not target.startswith("/") and target != "." else target
    expect = frozenset({0}) if kind == "ok" else ANY if kind in ("missing", "fifo", "long") else REFUSE
    if rng.random() < 0.7:
        argv: tuple[str, ...] = ("plan", str(b.model_paths["llama"]), "--device", "CUDA0=1GiB", "--ram", "4GiB",
                                 "-o", out)
    else:
        argv = ("fetch-header", str(b.model_paths["llama"]), "-o", out)
    check = str(d / target) if kind in ("ok", "missing", "readonly", "long", "too_long") else None
    return Case(i, "output", f"-o {kind}", argv, expect, str(d), output=check, as_nobody=True)


def gen_special(rng: random.Random, b: Bases, d: Path, i: int) -> Case:
    os.mkfifo(d / "fifo")
    (d / "loop").symlink_to(d / "loop")
    thing = rng.choice([str(d / "fifo"), "/dev/zero", "/dev/urandom", "/dev/null", str(d), str(d / "loop")])
    slot = rng.choice(["model", "devices", "sd", "draft"])
    model = str(b.model_paths["llama"])
    argv = {"model": ("inspect", thing), "devices": ("devices", "--devices", thing, "--no-llama"),
            "sd": ("sd-fit", thing, "--device", "CUDA0=8GiB", "--ram", "16GiB"),
            "draft": ("plan", model, "--device", "CUDA0=1GiB", "--ram", "4GiB", "--draft", thing)}[slot]
    return Case(i, "special", f"{slot} = {Path(thing).name}", argv, REFUSE, str(d))


Generator = Callable[[random.Random, Bases, Path, int], Case]
GENERATORS: dict[str, tuple[Generator, float]] = {
    "gguf": (gen_gguf, 40), "split": (gen_split, 8), "safetensors": (gen_safetensors, 12), "yaml": (gen_yaml, 12),
    "flags": (gen_flags, 12), "sd-fit": (gen_sdfit, 6), "output": (gen_output, 5), "special": (gen_special, 5),
}


def make_case(seed: int, i: int, bases: Bases, root: Path, sources: list[str] | None = None) -> Case:
    rng = random.Random(f"{seed}:{i}")
    names = sources or list(GENERATORS)
    source = rng.choices(names, weights=[GENERATORS[n][1] for n in names])[0]
    d = root / f"{i:07d}"
    d.mkdir()
    return GENERATORS[source][0](rng, bases, d, i)


# --- running: the fork server ------------------------------------------------------------------------

def _child(case: Case) -> None:
    """In the forked worker: limits, redirections, the CLI, and never a return."""
    code = 70
    try:
        d = Path(case.directory)
        os.chdir(d)
        for fd, name, flags in ((0, "/dev/null", os.O_RDONLY), (1, str(d / ".stdout"), os.O_WRONLY | os.O_CREAT),
                                (2, str(d / ".stderr"), os.O_WRONLY | os.O_CREAT)):
            with contextlib.suppress(OSError):
                os.unlink(name) if fd else None
            os.dup2(os.open(name, flags, 0o666), fd)
        if case.as_nobody:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        resource.setrlimit(resource.RLIMIT_AS, (case.as_limit, case.as_limit))
        from planner.cli.app import main
        rc = main(list(case.argv))
        code = rc if isinstance(rc, int) else 0
    except BaseException:   # an uncaught exception: the traceback is what the classifier looks for
        with contextlib.suppress(BaseException):
            traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code if 0 <= code < 256 else 1)


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def traceback_location(stderr: str) -> str:
    """The deepest frame of fitplan's own code in a traceback, and the exception's type."""
    tb = stderr[stderr.rfind("Traceback (most recent call last)"):]
    frames = [(f, ln, fn) for f, ln, fn in _FRAME.findall(tb) if "/planner/" in f or "/runtime/" in f]
    last = [ln for ln in tb.strip().splitlines() if ln and not ln.startswith(" ")]
    exc = last[-1].split(":", 1)[0] if last else "?"
    if not frames:
        return f"(outside fitplan) {exc}"
    f, ln, fn = frames[-1]
    rel = f[f.rfind("/planner/") + 1:] if "/planner/" in f else f[f.rfind("/runtime/") + 1:]
    return f"{rel}:{ln} {fn} {exc}"


def _partial(case: Case, rc: int | None) -> bool:
    d = Path(case.directory)
    leftovers = [p for p in d.rglob(".*partial*")] if d.exists() else []
    if leftovers:
        return True
    if case.output is None:
        return False
    out = Path(case.output)
    try:
        if rc != 0:
            return out.is_file()
    except OSError:    # a name too long to exist
        return False
    try:
        if case.argv[0] == "fetch-header":
            return not out.is_file() or out.read_bytes()[:4] != b"GGUF"
        return not out.is_file() or yaml.safe_load(out.read_text()) is None
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return True


def classify(case: Case, rc: int | None, hang: bool, stderr: str, rss_kib: int, sig: int | None) -> tuple[str, str]:
    if hang:
        return "hang", ""
    if "MemoryError" in stderr or sig in (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGKILL):
        return "memory", traceback_location(stderr) if "Traceback" in stderr else f"signal {sig}"
    if rss_kib * 1024 > case.as_limit:
        return "memory", ""
    if "Traceback (most recent call last)" in stderr:
        return "traceback", traceback_location(stderr)
    if _partial(case, rc):
        return "partial file", ""
    if rc not in case.expect:
        return "wrong exit", f"exit {rc}, expected {sorted(case.expect)}"
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("fitplan: what would fit")]
    if any("Warning" in ln for ln in lines) or any(len(ln) > MAX_LINE for ln in lines) or (rc != 0 and len(lines) > 1):
        return "unclear message", (lines[0][:100] if lines else "")
    return "ok", ""


def _read(path: Path, limit: int = 1 << 16) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _finish(case: Case, status: int, rusage: resource.struct_rusage, hang: bool, wall: float) -> Result:
    rc = os.waitstatus_to_exitcode(status)
    sig = -rc if rc < 0 else None
    stderr = _read(Path(case.directory) / ".stderr")
    cls, loc = classify(case, rc if rc >= 0 else None, hang, stderr, rusage.ru_maxrss, sig)
    return Result(case, cls, rc, wall, rusage.ru_maxrss, stderr[-400:], loc)


def run_forked(cases: list[Case], jobs: int, on_result: Callable[[Result], None]) -> None:
    pending = collections.deque(cases)
    running: dict[int, tuple[Case, float, bool]] = {}
    while pending or running:
        while pending and len(running) < jobs:
            case = pending.popleft()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(case)
            running[pid] = (case, time.monotonic(), False)
        pid, status, rusage = os.wait4(-1, os.WNOHANG)
        if pid == 0:
            now = time.monotonic()
            for p, (case, t0, killed) in list(running.items()):
                if not killed and now - t0 > TIME_LIMIT_S:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p, signal.SIGKILL)
                    running[p] = (case, t0, True)
            time.sleep(0.002)
            continue
        case, t0, killed = running.pop(pid)
        on_result(_finish(case, status, rusage, killed, time.monotonic() - t0))


def run_subprocess(case: Case) -> Result:
    """The same input as a real `python -m planner.cli` process, under the same limits."""
    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (case.as_limit, case.as_limit))

    root = Path(__file__).resolve().parents[2]   # the repository root: tests/fuzz/ is two below it
    env = {**os.environ, "PYTHONPATH": str(root)}
    d = Path(case.directory)
    t0 = time.monotonic()
    with open(d / ".stdout", "wb") as out, open(d / ".stderr", "wb") as err:
        p = subprocess.Popen([sys.executable, "-m", "planner.cli", *case.argv], cwd=d, stdin=subprocess.DEVNULL,
                             stdout=out, stderr=err, preexec_fn=limits, env=env)
        hang = False
        deadline = t0 + TIME_LIMIT_S + 1.0   # the interpreter's own start
        while True:
            pid, status, rusage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline and not hang:
                p.kill()
                hang = True
            time.sleep(0.005)
        p.returncode = 0
    return _finish(case, status, rusage, hang, time.monotonic() - t0)


def _cache_click_command() -> None:
    """Typer turns the app into a click command on every call (~0.15 s of signature inspection, most
    of a rejected input's run); the command is the same each time, so the workers inherit one."""
    import typer.main

    build = typer.main.get_command
    built: dict[int, object] = {}

    def get_command(app: typer.Typer) -> object:
        if id(app) not in built:
            built[id(app)] = build(app)
        return built[id(app)]

    typer.main.get_command = get_command   # type: ignore[assignment]


def warm_up(bases: Bases) -> None:
    """Import and exercise every command once here, so that the forked workers inherit it all."""
    from planner.cli.app import main

    _cache_click_command()
    m = str(bases.model_paths["llama"])
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for argv in (["inspect", m], ["estimate", m, "--format", "json", "--", "-c", "512"],
                     ["plan", m, "--device", "CUDA0=1GiB", "--ram", "4GiB"],
                     ["devices", "--no-llama", "--device", "CUDA0=8GiB"],
                     ["sd-fit", str(bases.safetensors), "--device", "CUDA0=8GiB", "--ram", "16GiB"],
                     ["inspect", "/nonexistent"]):
            main(argv)
    gc.freeze()   # the workers share these objects' pages instead of copying them on the collector's touch


# --- the report ---------------------------------------------------------------------------------------

def summary(results: list[Result], elapsed: float, jobs: int) -> str:
    n = len(results)
    by_class = collections.Counter(r.cls for r in results)
    lines = [f"{n} inputs in {elapsed:.1f} s with {jobs} worker(s): {n / elapsed:.1f} inputs/s "
             f"({100000 / max(n / elapsed, 1e-9) / 60:.0f} min for 100,000)", "", f"{'class':<16} {'count':>7}"]
    lines += [f"{c:<16} {by_class.get(c, 0):>7}" for c in CLASSES]
    sources = sorted({r.case.source for r in results})
    lines += ["", f"{'source':<12} " + " ".join(f"{c[:9]:>9}" for c in CLASSES) + "  peak RSS MiB  slowest s"]
    for s in sources:
        mine = [r for r in results if r.case.source == s]
        counts = collections.Counter(r.cls for r in mine)
        peak = max(r.rss_kib for r in mine) / 1024
        slowest = max(r.wall_s for r in mine)
        row = " ".join(f"{counts.get(c, 0):>9}" for c in CLASSES)
        lines.append(f"{s:<12} {row}  {peak:>12.0f}  {slowest:>9.2f}")
    locs = collections.Counter((r.cls, r.location) for r in results if r.cls in ("traceback", "memory") and r.location)
    if locs:
        lines += ["", "tracebacks and memory failures by source location:"]
        for (cls, loc), k in locs.most_common():
            ex = next(r for r in results if r.cls == cls and r.location == loc)
            lines.append(f"  {k:>5}  {cls:<9} {loc}   e.g. [{ex.case.source}] {ex.case.what[:70]}")
    for cls in CLASSES[1:]:
        bad = [r for r in results if r.cls == cls and not (cls in ("traceback", "memory") and r.location)]
        if bad:
            lines += ["", f"{cls}: {len(bad)}"]
            shown: dict[tuple[str, str, str], Result] = {}
            for r in bad:
                shown.setdefault((r.case.source, r.case.what[:50], r.location), r)
            for r in list(shown.values())[:12]:
                tail = r.stderr_tail.strip().splitlines()[-1][:110] if r.stderr_tail.strip() else ""
                argv = " ".join(r.case.argv)[:90]
                lines.append(f"  [{r.case.source}] {r.case.what[:60]} | {r.location} | {argv} | {tail}")
    return "\n".join(lines)


def run(count: int, seed: int, jobs: int, sample: int, sources: list[str] | None = None,
        keep: bool = False, progress: bool = True) -> tuple[list[Result], list[tuple[Result, Result]], float]:
    """Generate and run `count` inputs; return the results, the subprocess re-runs that classified
    differently (pairs: forked, subprocess) and the elapsed seconds."""
    root = Path(tempfile.mkdtemp(prefix="fitplan-fuzz-"))
    os.chmod(root, 0o755)
    try:
        bases = write_bases(root)
        warm_up(bases)
        results: list[Result] = []
        t0 = time.monotonic()
        batch = 64
        sampled = set(random.Random(seed).sample(range(count), min(sample, count)))
        for start in range(0, count, batch):
            cases = [make_case(seed, i, bases, root, sources) for i in range(start, min(start + batch, count))]
            run_forked(cases, jobs, results.append)
            for c in cases:
                if c.index not in sampled and not keep:
                    shutil.rmtree(c.directory, ignore_errors=True)
            if progress and (start // batch) % 16 == 15:
                print(f"  {len(results)} / {count} ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
        elapsed = time.monotonic() - t0
        # unprivileged cases stay forked: `nobody` cannot start the interpreter under /root/.pyenv
        again = [(r, run_subprocess(r.case)) for r in results if r.case.index in sampled and not r.case.as_nobody]
        return results, [(r, a) for r, a in again if a.cls != r.cls], elapsed
    finally:
        _clean(root, keep)


def _clean(root: Path, keep: bool) -> None:
    if keep:
        print(f"inputs kept in {root}", file=sys.stderr)
        return
    for p in root.rglob("*"):
        with contextlib.suppress(OSError):
            if p.is_dir() and not p.is_symlink():
                os.chmod(p, stat.S_IRWXU)
    shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="forked workers at once (this machine: 2 cores)")
    ap.add_argument("--sample", type=int, default=50, help="inputs re-run as real subprocesses")
    ap.add_argument("--source", action="append", choices=list(GENERATORS), help="only these generators")
    ap.add_argument("--keep", action="store_true", help="keep the generated inputs")
    ap.add_argument("--json", help="write every non-ok result here")
    a = ap.parse_args(argv)
    results, differ, elapsed = run(a.count, a.seed, a.jobs, a.sample, a.source, a.keep)
    print(summary(results, elapsed, a.jobs))
    print(f"\nsubprocess re-runs: {min(a.sample, a.count)}, classified differently: {len(differ)}")
    for r, again in differ[:10]:
        print(f"  [{r.case.source}] {r.case.what[:60]}: forked {r.cls}, subprocess {again.cls} {again.location}")
    if a.json:
        bad = [{"index": r.case.index, "source": r.case.source, "what": r.case.what, "argv": list(r.case.argv),
                "class": r.cls, "rc": r.rc, "location": r.location, "stderr": r.stderr_tail}
               for r in results if r.cls != "ok"]
        Path(a.json).write_text(json.dumps(bad, indent=1))
    return 0 if all(r.cls == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
