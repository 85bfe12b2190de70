"""With --format json|yaml every error is a document on stdout, {"error": {code, message, shortfalls,
suggestions}}, and stderr keeps its one line; a test per exit code (1 infeasible, 2 bad input)."""
from __future__ import annotations

import json

import pytest
import yaml

from planner.cli import main
from planner.cli.app import error_format
from planner.core.units import MiB
from planner.search import whatfits
from tests.support.overhead import cuda

# 100 MiB of room on CUDA0 beside the CUDA overhead a plan counts within the budget
TINY = ["--device", "CUDA0=1GiB", "--ram", "700MiB", "--max-vram", cuda(100), "--max-ram", "300MiB"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def check_document(doc: dict, code: str) -> dict:
    error = doc["error"]
    assert set(error) == {"code", "message", "shortfalls", "suggestions"}
    assert error["code"] == code and error["message"]
    for sf in error["shortfalls"]:
        assert set(sf) == {"device", "need_bytes", "budget_bytes"}
        assert isinstance(sf["need_bytes"], int) and isinstance(sf["budget_bytes"], int)
    return error


def test_infeasible_plan_prints_an_error_document_and_exits_1(capsys, monkeypatch):
    # the document's shape is checked, not the search's time limit: a loaded CI machine once ran
    # out of the 1.8 s before it reached CUDA0's row
    monkeypatch.setattr(whatfits, "SEARCH_SECONDS", 120.0)
    code, out, err = run(capsys, "plan", "example:gemma3-270m", *TINY, "--ctx", "32768", "--format", "json")
    assert code == 1
    error = check_document(json.loads(out), "infeasible")
    assert {sf["device"] for sf in error["shortfalls"]} == {"Host", "CUDA0"}
    host = next(sf for sf in error["shortfalls"] if sf["device"] == "Host")
    assert host["budget_bytes"] == 300 * MiB and host["need_bytes"] > host["budget_bytes"]
    assert host["need_bytes"] % MiB == 0
    hint = next(s for s in error["suggestions"] if s.get("device") == "Host")
    assert hint["budget_bytes"] == host["need_bytes"] and hint["exact"] is True
    # stderr keeps its one line (and the what-would-fit line), stdout holds only the document
    lines = err.strip().splitlines()
    assert lines[0].startswith("fitplan: error: no placement") and lines[1].startswith("fitplan: what would fit:")


@pytest.mark.parametrize("argv", [
    ["--ctx", "lots"],                       # refused by the command itself
    ["--format", "json", "--bogus-option"],  # refused by click while it reads the options
])
def test_bad_input_prints_an_error_document_and_exits_2(capsys, argv):
    code, out, err = run(capsys, "plan", "example:gemma3-270m", *TINY, *argv, "--format", "json")
    assert code == 2
    error = check_document(json.loads(out), "bad_input" if "--ctx" in argv else "usage")
    assert error["shortfalls"] == [] and error["suggestions"] == []
    assert ("--ctx" if "--ctx" in argv else "--bogus-option") in error["message"]
    assert err.strip() and "Traceback" not in err


def test_yaml_errors_and_a_missing_model(capsys, tmp_path):
    code, out, err = run(capsys, "plan", str(tmp_path / "missing.gguf"), *TINY, "--format", "yaml")
    assert code == 2
    check_document(yaml.safe_load(out), "bad_gguf")   # GGUFError: no such file
    assert err.startswith("fitplan: error:")


def test_table_format_errors_stay_on_stderr(capsys):
    code, out, err = run(capsys, "plan", "example:gemma3-270m", *TINY, "--ctx", "lots")
    assert code == 2 and out == "" and err.startswith("fitplan: error:")


def test_the_format_is_read_before_llama_flags():
    assert error_format(["plan", "m", "--format", "json"]) == "json"
    assert error_format(["plan", "m", "--format=yaml"]) == "yaml"
    assert error_format(["plan", "m", "--format", "table"]) is None
    assert error_format(["estimate", "m", "--", "--format", "json"]) is None
