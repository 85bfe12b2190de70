"""The coverage table (planner/memory/coverage.py) over the pin's own lists (planner/gguf/data)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import tarfile
from pathlib import Path

import gguf
import pytest

from planner.gguf.pin_lists import pin_architectures, pin_projectors
from planner.memory.coverage import (
    Status,
    architecture_coverage,
    counts,
    coverage_table,
    projector_coverage,
    projector_table,
)
from planner.model.arch import KNOWN_DENSE, RECURRENT_RULES, SWA_RULES
from runtime.engine.clip_hparams import SUPPORTED
from runtime.engine.hparams import ARCHS

ROOT = Path(__file__).resolve().parents[3]
PIN = "llama-cpp-python==0.3.36"    # DESIGN.md's pin: its sdist vendors llama.cpp 0c1e570
SOURCES = ("vendor/llama.cpp/src/llama-arch.cpp", "vendor/llama.cpp/tools/mtmd/clip-impl.h")


def _pin_lists_script():
    spec = importlib.util.spec_from_file_location("pin_lists_script", ROOT / "scripts" / "pin_lists.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_pin_architecture_is_decided():
    undecided = [r.name for r in coverage_table() if r.status is Status.UNDECIDED]
    assert not undecided, f"the pin lists architectures the coverage table does not decide: {undecided}"
    assert len(coverage_table()) == len(pin_architectures()) > 100


def test_every_pin_projector_is_decided():
    rows = projector_table()
    assert all(r.status in (Status.SIMULATED, Status.REFUSED) for r in rows), rows
    assert counts(rows)[Status.SIMULATED] == len(set(SUPPORTED))


def test_every_name_fitplan_tables_hold_is_the_pins():
    """A KV rule, builder or projector head for a name the pin does not have is stale (a rename)."""
    tables = set(KNOWN_DENSE) | set(SWA_RULES) | set(RECURRENT_RULES) | set(ARCHS)
    assert tables - set(pin_architectures()) == set()
    assert {str(p) for p in SUPPORTED} - set(pin_projectors()) == set()


def test_rows_against_facts_of_their_own():
    llama = architecture_coverage("llama")
    assert (llama.status, llama.kv, llama.compute) == (Status.SIMULATED, "exact", "simulated")
    # laguna has an SWA rule and no graph builder in runtime/engine
    laguna = architecture_coverage("laguna")
    assert (laguna.status, laguna.kv, laguna.compute) == (Status.FORMULA, "exact", "formula")
    assert "analytic.py" in laguna.reason
    # t5: no layer facts in planner/model/arch.py
    t5 = architecture_coverage("t5")
    assert (t5.status, t5.kv) == (Status.WEIGHTS_ONLY, "not sized")
    assert architecture_coverage("deepseek2").sm_tensor_refused
    assert architecture_coverage("no-such-arch").status is Status.UNDECIDED
    refused = projector_coverage("cogvlm")
    assert refused.status is Status.REFUSED and "UnsupportedProjector" in refused.reason
    assert projector_coverage("gemma3").status is Status.SIMULATED


def test_pin_lists_agree_with_gguf_py():
    # the installed gguf-py, whose names are the pin's or older: every name it knows, the pin knows
    # ("clip" is left out)
    assert set(gguf.MODEL_ARCH_NAMES.values()) - {"clip"} <= set(pin_architectures())
    assert len(set(pin_architectures())) == len(pin_architectures())


EXCERPT = '''
static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {
    { LLM_ARCH_CLIP,             "clip"             }, // dummy, only used by llama-quantize
    { LLM_ARCH_LLAMA,            "llama"            },
    { LLM_ARCH_GEMMA_EMBEDDING,  "gemma-embedding"  },
    { LLM_ARCH_UNKNOWN,          "(unknown)"        },
};
static const std::map<llm_kv, const char *> LLM_KV_NAMES = {
    { LLM_KV_GENERAL_TYPE, "general.type" },
};
'''


def test_extractor_on_an_excerpt():
    script = _pin_lists_script()
    assert script.table_names(EXCERPT, "LLM_ARCH_NAMES") == ["clip", "llama", "gemma-embedding", "(unknown)"]
    with pytest.raises(ValueError, match="not found"):
        script.table_names(EXCERPT, "PROJECTOR_TYPE_NAMES")


@pytest.fixture(scope="session")
def pin_sdist(tmp_path_factory) -> Path:
    """The pin's sdist from PyPI (pip's cache usually has it: scripts/build_llama_cpp.sh downloads the same
    file), with only the two files the lists come from unpacked; a failed download fails the test."""
    work = tmp_path_factory.mktemp("pin-sdist")
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps",
                    PIN, "-d", str(work)], check=True, timeout=600)
    [archive] = work.glob("llama_cpp_python-*.tar.gz")
    root = work / archive.name.removesuffix(".tar.gz")
    with tarfile.open(archive) as tar:
        for source in SOURCES:
            member = tar.getmember(f"{root.name}/{source}")
            target = work / member.name
            target.parent.mkdir(parents=True, exist_ok=True)
            source_file = tar.extractfile(member)
            assert source_file is not None, member.name
            target.write_bytes(source_file.read())
    return root


def test_committed_lists_are_what_the_script_extracts(pin_sdist):
    files = _pin_lists_script().extract(pin_sdist, commit="0c1e570")
    data = ROOT / "planner" / "gguf" / "data"
    for name, text in files.items():
        assert (data / name).read_text() == text, name


def test_a_new_pin_architecture_lands_as_weights_only(monkeypatch):
    """Moving the pin adds names: each is decided by model_facts' rule for a name in no table."""
    import planner.memory.coverage as coverage

    monkeypatch.setattr(coverage, "pin_architectures", lambda: (*pin_architectures(), "gemma9"))
    row = coverage.architecture_coverage("gemma9")
    assert (row.status, row.kv, row.compute) == (Status.WEIGHTS_ONLY, "not sized", "formula")
    assert "UNKNOWN" in row.reason


def test_contradicting_tables_are_undecided(monkeypatch):
    import planner.memory.coverage as coverage

    # a graph builder for an architecture without KV facts: the reserve would size no cache
    monkeypatch.setattr(coverage, "ARCHS", {**ARCHS, "t5": ARCHS["llama"]})
    assert coverage.architecture_coverage("t5").status is Status.UNDECIDED
    monkeypatch.setattr(coverage, "KNOWN_DENSE", KNOWN_DENSE | {"jamba"})
    assert coverage.architecture_coverage("jamba").status is Status.UNDECIDED
