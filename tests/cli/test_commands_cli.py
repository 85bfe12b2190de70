"""Commands that paste (issue 17): every line `fitplan plan` prints is one shell line that bash
splits into exactly the plan's argument vector, the llama-bench line included; `--format args`
and `-0` give the same vector; the plan file stores it and `validate`/`serve` read it back."""
from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from planner.cli import main
from planner.emit.document import read_deployment
from planner.llama.flags import parse_llama_flags
from tests.support.command_matrix import CASES, PlanCase


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def bash_words(line: str) -> list[str]:
    """The words bash makes of `line` pasted as a command (it runs printf in its place)."""
    done = subprocess.run(["bash", "-c", 'printf "%s\\0" ' + line], capture_output=True, check=True)
    return done.stdout.decode().split("\0")[:-1]


def printed_commands(table: str) -> dict[str, str]:
    """The command lines under "run it:" / "measure it:", by program name."""
    lines = [line.strip() for line in table.splitlines()]
    return {line.split()[0]: line for line in lines if line.startswith(("llama-server ", "llama-bench "))}


@pytest.fixture(scope="module")
def shapes_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("shapes")


@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
def test_the_printed_lines_are_the_plan_argv_in_bash(capsys, tmp_path, shapes_dir, case: PlanCase):
    doc_path = tmp_path / "plan.json"
    code, out, err = run(capsys, *case.argv(shapes_dir), "-o", str(doc_path))
    assert code == 0, err
    doc = json.loads(doc_path.read_text())
    argv = doc["argv"]
    assert argv[:2] == ["-m", doc["model"]["path"]]
    assert case.expect in " ".join(argv)
    commands = printed_commands(out)
    # byte for byte: bash -n would not notice '\.' turning into '.'
    assert bash_words(commands["llama-server"]) == ["llama-server", *argv]
    flags = parse_llama_flags(argv[2:])
    assert argv[argv.index("-np") + 1] == str(flags.n_parallel) and "-fit" in argv
    assert doc["flags"] == " ".join(argv[2:])   # the string older readers split on spaces
    if doc["llama_bench_argv"] is None:
        assert "llama-bench" not in commands and doc["llama_bench_note"] in out
    else:
        bench = doc["llama_bench_argv"]
        assert bash_words(commands["llama-bench"]) == ["llama-bench", *bench]
        assert bench.count("-ot") <= 1 and not any(a.startswith("-ot") and a != "-ot" for a in bench)
        if flags.tensor_split:
            assert "," not in bench[bench.index("-ts") + 1]


def test_json_format_carries_argv(capsys, shapes_dir):
    case = CASES[0]
    code, out, _ = run(capsys, *case.argv(shapes_dir), "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert isinstance(doc["flags"], str) and doc["argv"][:2] == ["-m", doc["model"]]
    code, line, _ = run(capsys, *case.argv(shapes_dir), "--format", "command")
    assert bash_words(line.strip()) == ["llama-server", *doc["argv"]]


def test_args_format_feeds_xargs(capsys, shapes_dir):
    case = CASES[0]
    _, out, _ = run(capsys, *case.argv(shapes_dir), "--format", "json")
    argv = json.loads(out)["argv"]
    _, lines, _ = run(capsys, *case.argv(shapes_dir), "--format", "args")
    assert lines.splitlines() == argv
    _, nul, _ = run(capsys, *case.argv(shapes_dir), "--format", "args", "-0")
    done = subprocess.run(["xargs", "-0", "bash", "-c", 'printf "%s\\0" "$@"', "llama-server"],
                          input=nul.encode(), capture_output=True, check=True)
    assert done.stdout.decode().split("\0")[:-1] == argv


def test_nul_only_with_args(capsys, shapes_dir):
    code, _, err = run(capsys, *CASES[0].argv(shapes_dir), "--format", "json", "-0")
    assert code == 2 and "-0: only with --format args" in err


def test_the_plan_file_is_read_back_from_argv(capsys, tmp_path, shapes_dir):
    case = next(c for c in CASES if "_(ch|)exps" in c.expect)
    target = tmp_path / "plan.yaml"
    code, _, err = run(capsys, *case.argv(shapes_dir), "-o", str(target))
    assert code == 0, err
    doc = yaml.safe_load(target.read_text())
    back = read_deployment(str(target))
    assert back.argv == tuple(doc["argv"]) and back.flag_argv == tuple(doc["argv"][2:])
    assert back.flags == parse_llama_flags(doc["argv"][2:])
    # argv wins over flags; a document from before argv existed is read from flags
    doc["flags"] = "-c 16"
    target.write_text(yaml.safe_dump(doc))
    assert read_deployment(str(target)).flags == back.flags
    del doc["argv"]
    doc["flags"] = "-c 512 -np 1"
    target.write_text(yaml.safe_dump(doc))
    old = read_deployment(str(target))
    assert old.flags.n_ctx == 512 and old.argv == ("-m", doc["model"]["path"], "-c", "512", "-np", "1")


def test_an_argv_without_the_model_is_not_a_plan(capsys, tmp_path, shapes_dir):
    target = tmp_path / "plan.yaml"
    assert run(capsys, *CASES[0].argv(shapes_dir), "-o", str(target))[0] == 0
    doc = yaml.safe_load(target.read_text())
    doc["argv"] = doc["argv"][2:]
    target.write_text(yaml.safe_dump(doc))
    code, _, err = run(capsys, "validate", str(target), "--reserve-only")
    assert code == 2 and "not a fitplan plan file" in err and "argv" in err


def test_version_names_the_pinned_llama_cpp(capsys):
    from planner.system.llama_tools import LLAMA_CPP_PIN

    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out.splitlines()[0].startswith("fitplan ") and LLAMA_CPP_PIN in out


def test_shell_completion_is_on(capsys, monkeypatch):
    # typer names the shell from the process tree unless told not to; a test run whose ancestors
    # include no shell (a detached job) would get "Shell  not supported." instead of bash's script
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    code, out, _ = run(capsys, "--show-completion", "bash")
    assert code == 0 and "_FITPLAN_COMPLETE=complete_bash" in out and "complete " in out
    code, out, _ = run(capsys, "--help")
    assert "--install-completion" in out
