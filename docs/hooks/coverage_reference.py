"""MkDocs hook: the coverage table, one row per architecture and projector type of the pinned llama.cpp.

`<!-- fitplan:coverage -->` becomes the counts and the two tables. Each row is
planner.memory.coverage's answer for a name of the pin's own lists (planner/gguf/data, extracted by
scripts/pin_lists.py), so a builder or KV rule added to the code shows here at the next build. The
peer-test column is found from the tests themselves: the shapes of the estimate matrix
(tests/support/estimate_matrix.py MODELS, each written by planner.synth and read back for its
architecture) are checked against llama-fit-params by tests/peer/test_estimate_peer.py; any other
tests/peer file counts for the architectures of the models it builds (planner.synth's `*_spec`
builders it names that take no argument, the family shapes `shapes_<family>.<name>` it names,
SHAPES names it quotes, the bundled example it loads); the
projector types tests/peer/test_mmproj_peer.py lists (PROJECTORS) are checked against llama-server.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import re
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

MARKER = "<!-- fitplan:coverage -->"
ROOT = Path(__file__).resolve().parents[2]
ESTIMATE_PEER = "tests/peer/test_estimate_peer.py"
MMPROJ_PEER = "tests/peer/test_mmproj_peer.py"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, coverage_page())
    return markdown


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def estimate_peer_archs() -> set[str]:
    """The architectures of the estimate matrix's models, read from the files the peer test loads."""
    from planner.gguf.reader import read_model

    # loaded from its file: mkdocs runs without the repository root on sys.path, and the module imports
    # only the installed package
    spec = importlib.util.spec_from_file_location("estimate_matrix", ROOT / "tests/support/estimate_matrix.py")
    assert spec is not None and spec.loader is not None
    matrix = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(matrix)
    with tempfile.TemporaryDirectory() as tmp:
        return {read_model(matrix.model_path(name, Path(tmp))).architecture for name in matrix.MODELS}


def _spec_builders() -> dict[str, Any]:
    import planner.synth

    out: dict[str, Any] = {}
    for info in pkgutil.iter_modules(planner.synth.__path__):
        module = importlib.import_module(f"planner.synth.{info.name}")
        out.update({n: f for n, f in vars(module).items() if n.endswith("_spec") and callable(f)})
    return out


def _family_shapes_named(text: str) -> set[tuple[str, str]]:
    """(family module, function) pairs a test names: `shapes_x.fn`, or `from planner.synth.shapes_x import fn, …`."""
    pairs = set(re.findall(r"\b(shapes_[a-z0-9_]+)\.([a-z0-9_]+)\b", text))
    for family, names in re.findall(r"from planner\.synth\.(shapes_[a-z0-9_]+) import (\([^)]*\)|[^\n]+)", text):
        pairs |= {(family, n.strip()) for n in names.strip("()").replace("\n", " ").split(",") if n.strip()}
    return pairs


def _family_shape_arch(family: str, name: str) -> str | None:
    """The architecture of planner.synth.<family>.<name>() (a family module's shape-faithful file)."""
    try:
        module = importlib.import_module(f"planner.synth.{family}")
    except ImportError:
        return None
    fn = getattr(module, name, None)
    if not callable(fn):
        return None
    try:
        shape = fn()
    except TypeError:   # a function that needs arguments is not a shape
        return None
    arch = getattr(shape, "arch", None)   # stable-diffusion checkpoints (shapes_sd) are no GGUF of an architecture
    return None if arch is None else str(arch)


def peer_tests_by_arch() -> dict[str, list[str]]:
    """Architecture -> the tests/peer files that load a model of it with the pinned llama.cpp."""
    from planner.gguf.reader import read_model
    from planner.registry.examples import resolve_model
    from planner.synth.shapes_common import SHAPES

    found: dict[str, set[str]] = defaultdict(set)
    for arch in estimate_peer_archs():
        found[arch].add(ESTIMATE_PEER)
    builders = _spec_builders()
    shape_arch = {name: f().arch for name, f in SHAPES.items()}
    example_arch = read_model(resolve_model("example:gemma3-270m")).architecture
    for path in sorted((ROOT / "tests" / "peer").glob("test_*.py")):
        text, rel = path.read_text(), str(path.relative_to(ROOT))
        for name in set(re.findall(r"\b([a-z0-9_]+_spec)\b", text)) & builders.keys():
            try:
                found[builders[name]().arch].add(rel)
            except TypeError:   # a builder that needs arguments: its architecture is not read here
                continue
        for name in set(re.findall(r'"([a-z0-9.-]+)"', text)) & shape_arch.keys():
            found[shape_arch[name]].add(rel)
        for family, name in _family_shapes_named(text):
            arch = _family_shape_arch(family, name)
            if arch:
                found[arch].add(rel)
        if "example:gemma3-270m" in text:
            found[example_arch].add(rel)
    return {arch: sorted(files, key=lambda f: (f != ESTIMATE_PEER, f)) for arch, files in found.items()}


def mmproj_peer_types() -> set[str]:
    """The projector type of each projector test_mmproj_peer.py checks (its PROJECTORS tuple)."""
    from gguf import Keys

    from planner.synth import mmproj_factory

    tree = ast.parse((ROOT / MMPROJ_PEER).read_text())
    names: tuple[str, ...] = ()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PROJECTORS" for t in node.targets):
            names = ast.literal_eval(node.value)
    if not names:
        raise ValueError(f"{MMPROJ_PEER}: no PROJECTORS tuple")
    # clip.projector_type, else the audio one (Qwen3-ASR's converter writes only clip.audio.projector_type)
    metas = [getattr(mmproj_factory, f"{n}_mmproj_spec")().metadata for n in names]
    return {str(m.get(Keys.Clip.PROJECTOR_TYPE) or m[Keys.ClipAudio.PROJECTOR_TYPE]) for m in metas}


def _files(files: list[str]) -> str:
    return ", ".join(f"`{Path(f).name}`" for f in files)


def coverage_page() -> str:
    from planner.gguf.pin_lists import ARCHITECTURES_FILE, PROJECTORS_FILE, source
    from planner.memory.coverage import Status, counts, coverage_table, projector_table

    archs, projs = coverage_table(), projector_table()
    undecided = [r.name for r in archs + projs if r.status is Status.UNDECIDED]
    if undecided:
        raise ValueError(f"coverage undecided for {', '.join(undecided)}")
    peer_archs, peer_projs = peer_tests_by_arch(), mmproj_peer_types()
    n, m = counts(archs), counts(projs)
    out = [f"{len(archs)} architectures ({source(ARCHITECTURES_FILE)}): "
           + ", ".join(f"{n[s]} {s.value}" for s in Status if s is not Status.UNDECIDED) + ".", "",
           "| architecture | status | KV | compute | -sm tensor | reason | peer test |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    out += [f"| `{r.name}` | {r.status.value} | {r.kv} | {r.compute} | {'refused' if r.sm_tensor_refused else ''} "
            f"| {_cell(r.reason)} | {_files(peer_archs.get(r.name, []))} |" for r in archs]
    out += ["", "## Projectors (`-mm`)", "",
            f"{len(projs)} projector types ({source(PROJECTORS_FILE)}): "
            f"{m[Status.SIMULATED]} simulated, {m[Status.REFUSED]} refused.", "",
            "| projector type | status | reason | peer test |", "| --- | --- | --- | --- |"]
    out += [f"| `{r.name}` | {r.status.value} | {_cell(r.reason)} "
            f"| {_files([MMPROJ_PEER] if r.name in peer_projs else [])} |" for r in projs]
    return "\n".join(out) + "\n"
