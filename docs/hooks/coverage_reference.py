"""MkDocs hook: the coverage table, one row per architecture and projector type of the pinned llama.cpp.

`<!-- fitplan:coverage -->` becomes the counts and the two tables. Each row is
planner.memory.coverage's answer for a name of the pin's own lists (planner/llama/data, extracted by
scripts/pin_lists.py), so a builder or KV rule added to the code shows here at the next build. The
peer-test column is found from the tests themselves: the shapes of the estimate matrix
(tests/support/estimate_matrix.py MODELS, each written by planner.synth and read back for its
architecture) are checked against llama-fit-params by tests/peer/test_estimate_peer.py, and the
projector types tests/peer/test_mmproj_peer.py lists (PROJECTORS) against llama-server.
"""
from __future__ import annotations

import ast
import tempfile
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
    from tests.support.estimate_matrix import MODELS, model_path

    with tempfile.TemporaryDirectory() as tmp:
        return {read_model(model_path(name, Path(tmp))).architecture for name in MODELS}


def mmproj_peer_types() -> set[str]:
    """The clip.projector_type of each projector test_mmproj_peer.py checks (its PROJECTORS tuple)."""
    from gguf import Keys

    from planner.synth import mmproj_factory

    tree = ast.parse((ROOT / MMPROJ_PEER).read_text())
    names: tuple[str, ...] = ()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PROJECTORS" for t in node.targets):
            names = ast.literal_eval(node.value)
    if not names:
        raise RuntimeError(f"{MMPROJ_PEER}: no PROJECTORS tuple")
    return {str(getattr(mmproj_factory, f"{n}_mmproj_spec")().metadata[Keys.Clip.PROJECTOR_TYPE]) for n in names}


def coverage_page() -> str:
    from planner.llama.pin_lists import ARCHITECTURES_FILE, PROJECTORS_FILE, source
    from planner.memory.coverage import Status, counts, coverage_table, projector_table

    archs, projs = coverage_table(), projector_table()
    undecided = [r.name for r in archs + projs if r.status is Status.UNDECIDED]
    if undecided:
        raise RuntimeError(f"coverage undecided for {', '.join(undecided)}")
    peer_archs, peer_projs = estimate_peer_archs(), mmproj_peer_types()
    n, m = counts(archs), counts(projs)
    out = [f"{len(archs)} architectures ({source(ARCHITECTURES_FILE)}): "
           + ", ".join(f"{n[s]} {s.value}" for s in Status if s is not Status.UNDECIDED) + ".", "",
           "| architecture | status | KV | compute | -sm tensor | reason | peer test |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    out += [f"| `{r.name}` | {r.status.value} | {r.kv} | {r.compute} | {'refused' if r.sm_tensor_refused else ''} "
            f"| {_cell(r.reason)} | {f'`{ESTIMATE_PEER}`' if r.name in peer_archs else ''} |" for r in archs]
    out += ["", "## Projectors (`-mm`)", "",
            f"{len(projs)} projector types ({source(PROJECTORS_FILE)}): "
            f"{m[Status.SIMULATED]} simulated, {m[Status.REFUSED]} refused.", "",
            "| projector type | status | reason | peer test |", "| --- | --- | --- | --- |"]
    out += [f"| `{r.name}` | {r.status.value} | {_cell(r.reason)} "
            f"| {f'`{MMPROJ_PEER}`' if r.name in peer_projs else ''} |" for r in projs]
    return "\n".join(out) + "\n"
