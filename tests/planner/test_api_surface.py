"""planner.api's lazy names: each submodule's __all__, the table __getattr__ reads (_SUBMODULES) and the
TYPE_CHECKING imports type checkers read name the same things, and each resolves."""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import planner.api as api

INIT = Path(api.__file__)


def _type_checking_imports() -> dict[str, set[str]]:
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    [block] = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    out: dict[str, set[str]] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module
        out.setdefault(node.module.rsplit(".", 1)[1], set()).update(a.name for a in node.names)
    return out


def test_the_three_lists_agree():
    imported = _type_checking_imports()
    assert set(imported) == set(api._SUBMODULES)
    for module, names in api._SUBMODULES.items():
        given = importlib.import_module(f"planner.api.{module}").__all__
        assert sorted(names) == sorted(given) == sorted(imported[module]), module


def test_every_exported_name_resolves():
    for name in api.__all__:
        assert getattr(api, name) is not None, name


def test_the_command_line_loads_no_heavy_part_of_the_api():
    code = ("import sys; from planner.cli.app import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('planner.api.') or m in ('numpy', 'gguf')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=INIT.parents[2], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "['planner.api.machine']"


def test_an_option_enum_refuses_in_one_line_with_exit_2(capsys):
    from planner.cli.app import main

    assert main(["plan", "example:gemma3-270m", "--objective", "fastest"]) == 2
    assert capsys.readouterr().err == "fitplan: error: --objective 'fastest': expected throughput | context | balance\n"
    assert main(["choose", "hf://o/r", "--op-offload", "maybe", "--format", "json"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "fitplan: error: --op-offload 'maybe': expected auto | on | off\n"
    assert '"code": "bad_input"' in captured.out


def test_help_lists_an_enum_option_s_choices(capsys):
    from planner.cli.app import main

    assert main(["sweep", "--help"]) == 0
    out = capsys.readouterr().out
    assert "[estimate|plan]" in out and "[csv|table|json|yaml]" in out
