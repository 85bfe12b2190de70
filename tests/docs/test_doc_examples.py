"""Every `console` example of README.md and docs/**/*.md, run and compared with what it shows.

The format (shared by everyone who writes docs): a fenced block whose info string is `console`;
a line starting with `$ ` is a command, run by bash from the repository root (a line ending in
`\\` continues on the next); the lines after it, up to the next `$ ` line, are its expected
stdout and stderr together. Trailing whitespace and trailing blank lines are ignored, and a line
that is `...` alone matches any number of lines (none included). Paths under the home directory
are compared as `~/...` (the bundled example model is assembled under ~/.cache/fitplan, which
differs from machine to machine).

`fitplan` on PATH is this tree's code: a shim that execs `sys.executable -m planner.cli`. One
pytest item per block, named FILE:LINE; a mismatch prints the command and a diff.
"""
from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from planner.system.net import fitplan_cache

ROOT = Path(__file__).resolve().parents[2]
WILDCARD = "..."
PROMPT = "$ "
COMMAND_TIMEOUT_S = 120
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*console\s*$")


@dataclass(frozen=True)
class Example:
    """One command of a console block and the output the page shows for it."""

    command: str
    expected: tuple[str, ...]
    line: int                   # where the command starts in its file (1-based)


@dataclass(frozen=True)
class Block:
    file: str                   # relative to the repository root
    line: int                   # the fence's line (1-based)
    examples: tuple[Example, ...]

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


# ----------------------------------------------------------------------------- reading the pages

def console_blocks(text: str, file: str) -> list[Block]:
    """The console blocks of one Markdown text."""
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, fence = m.group(1), m.group(2)
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        if i == len(lines):
            raise ValueError(f"{file}:{start}: console block never closed")
        blocks.append(Block(file, start, tuple(parse_block(body, start + 1, file))))
        i += 1
    return blocks


def parse_block(body: list[str], first_line: int, file: str = "<block>") -> list[Example]:
    """Split a console block's lines into commands (with continuations) and expected outputs."""
    examples: list[Example] = []
    i = 0
    if body and not body[0].startswith(PROMPT):
        raise ValueError(f"{file}:{first_line}: a console block starts with a '$ ' command line")
    while i < len(body):
        line_no = first_line + i
        command = [body[i][len(PROMPT):]]
        while command[-1].endswith("\\") and i + 1 < len(body):
            i += 1
            command.append(body[i])
        i += 1
        expected = []
        while i < len(body) and not body[i].startswith(PROMPT):
            expected.append(body[i])
            i += 1
        examples.append(Example("\n".join(command), tuple(expected), line_no))
    return examples


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def all_blocks(root: Path = ROOT) -> list[Block]:
    out = []
    for path in doc_files(root):
        if path.exists():
            out += console_blocks(path.read_text(encoding="utf-8"), str(path.relative_to(root)))
    return out


# ----------------------------------------------------------------------------- comparing

def _trimmed(lines: list[str] | tuple[str, ...]) -> list[str]:
    out = [line.rstrip() for line in lines]
    while out and not out[-1]:
        out.pop()
    return out


def matches(expected: list[str] | tuple[str, ...], actual: list[str] | tuple[str, ...]) -> bool:
    """Whether `actual` is `expected` line for line, a `...` line standing for any number of lines."""
    want, got = _trimmed(expected), _trimmed(actual)
    # can[i][j]: want[i:] matches got[j:]
    can = [[False] * (len(got) + 1) for _ in range(len(want) + 1)]
    can[len(want)][len(got)] = True
    for i in range(len(want) - 1, -1, -1):
        for j in range(len(got), -1, -1):
            if want[i] == WILDCARD:
                can[i][j] = can[i + 1][j] or (j < len(got) and can[i][j + 1])
            else:
                can[i][j] = j < len(got) and want[i] == got[j] and can[i + 1][j + 1]
    return can[0][0]


def mismatch_report(example: Example, actual: list[str], where: str) -> str | None:
    """None when the output matches; else the command and a diff of shown against produced."""
    if matches(example.expected, actual):
        return None
    diff = difflib.unified_diff(_trimmed(example.expected), _trimmed(actual), "shown in the docs", "produced",
                                lineterm="", n=2)
    return f"{where}: the output of\n  $ {example.command}\ndiffers from the page:\n" + "\n".join(diff)


# ----------------------------------------------------------------------------- running

def shim_dir(tmp: Path) -> Path:
    """A directory holding a `fitplan` that runs this tree's planner with this interpreter."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "fitplan"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m planner.cli "$@"\n')
    shim.chmod(0o755)
    return bin_dir


def run(command: str, bin_dir: Path) -> list[str]:
    """stdout and stderr of `command` run by bash from the repository root, home paths as `~/`."""
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=COMMAND_TIMEOUT_S)
    return home_as_tilde(cache_as_default(done.stdout)).splitlines()


def cache_as_default(text: str) -> str:
    """fitplan's cache where the environment moves it (XDG_CACHE_HOME, FITPLAN_CACHE) shown at its default
    place, ~/.cache/fitplan, as the docs show the bundled example's path."""
    own, default = str(fitplan_cache()).rstrip("/"), str(Path.home() / ".cache" / "fitplan")
    return text.replace(own + "/", default + "/") if own != default else text


def home_as_tilde(text: str) -> str:
    home = str(Path.home()).rstrip("/")
    return text.replace(home + "/", "~/") if len(home) > 1 else text


def check_block(block: Block, bin_dir: Path) -> list[str]:
    """The mismatch reports of a block's commands (empty when every one matches)."""
    reports = []
    for example in block.examples:
        report = mismatch_report(example, run(example.command, bin_dir), f"{block.file}:{example.line}")
        if report:
            reports.append(report)
    return reports


# ----------------------------------------------------------------------------- the tests

BLOCKS = all_blocks()


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_console_example(block: Block, tmp_path: Path) -> None:
    reports = check_block(block, shim_dir(tmp_path))
    if reports:
        pytest.fail("\n\n".join(reports), pytrace=False)


def test_the_docs_have_console_examples() -> None:
    """The README and the getting-started page show tested output (a parse that found none is a bug)."""
    files = {b.file for b in BLOCKS}
    assert {"README.md", "docs/getting-started.md"} <= files


def test_an_edited_expected_line_is_reported(tmp_path: Path) -> None:
    text = "intro\n\n```console\n$ echo one; echo two\none\nthree\n```\n"
    [block] = console_blocks(text, "page.md")
    reports = check_block(block, shim_dir(tmp_path))
    assert len(reports) == 1
    assert "page.md:4" in reports[0] and "$ echo one; echo two" in reports[0]
    assert "-three" in reports[0] and "+two" in reports[0]


def test_the_shim_runs_this_trees_fitplan(tmp_path: Path) -> None:
    [block] = console_blocks("```console\n$ fitplan --version\n...\n```\n", "page.md")
    bin_dir = shim_dir(tmp_path)
    assert check_block(block, bin_dir) == []
    out = run(f"{sys.executable} -c 'import planner; print(planner.__file__)'", bin_dir)
    assert out == [home_as_tilde(str(ROOT / "planner" / "__init__.py"))]
    assert run("command -v fitplan", bin_dir) == [home_as_tilde(str(bin_dir / "fitplan"))]


def test_parse_commands_continuations_and_outputs() -> None:
    text = ("```console\n$ printf 'a\\n' \\\n  && echo b\na\nb\n$ true\n```\n"
            "```sh\n$ not run\n```\n")
    [block] = console_blocks(text, "p.md")
    assert block.line == 1
    assert [e.command for e in block.examples] == ["printf 'a\\n' \\\n  && echo b", "true"]
    assert [e.expected for e in block.examples] == [("a", "b"), ()]
    assert [e.line for e in block.examples] == [2, 6]


@pytest.mark.parametrize(("expected", "actual", "ok"), [
    (["a", "...", "d"], ["a", "b", "c", "d"], True),
    (["a", "...", "b"], ["a", "b"], True),              # `...` may stand for no line
    (["...", "c"], ["a", "b", "c"], True),
    (["a", "..."], ["a"], True),
    (["a", "...", "d"], ["a", "b", "c"], False),        # the line after `...` must still come
    (["a", "b"], ["a", "b", "c"], False),               # without `...` every line counts
    (["a  ", ""], ["a", "", ""], True),                  # trailing blanks and spaces do not
    (["a", "x"], ["a", "b"], False),
])
def test_the_wildcard_rule(expected: list[str], actual: list[str], ok: bool) -> None:
    assert matches(expected, actual) is ok


def test_home_paths_are_compared_as_tilde(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/someone")
    assert home_as_tilde("-m /home/someone/.cache/fitplan/x.gguf /home/someoneelse") == \
        "-m ~/.cache/fitplan/x.gguf /home/someoneelse"
    monkeypatch.setenv("HOME", "/")
    assert home_as_tilde("/x/y") == "/x/y"


def test_the_readme_lists_every_command() -> None:
    """The README's command table has one row per command of the typer app, and no other."""
    import typer

    from planner.cli.app import app

    group = typer.main.get_command(app)
    commands = set(group.list_commands(None))   # type: ignore[arg-type]
    rows = re.findall(r"^\| `fitplan ([a-z-]+)` \|", (ROOT / "README.md").read_text(encoding="utf-8"), re.MULTILINE)
    assert sorted(rows) == sorted(commands)


def heading_anchor(heading: str) -> str:
    """The anchor GitHub and MkDocs give a plain heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_heading_anchor() -> None:
    assert heading_anchor("Estimate vs llama-fit-params") == "estimate-vs-llama-fit-params"
    assert heading_anchor("The llama.cpp it matches") == "the-llamacpp-it-matches"


def test_the_readme_links_resolve() -> None:
    """Every relative link of the README names a file of the tree, and an anchor names a heading there."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    broken = []
    for link in links:
        if re.match(r"^[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        if not target.exists():
            broken.append(link)
        elif anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(encoding="utf-8"), re.MULTILINE)
            if anchor not in {heading_anchor(h) for h in headings}:
                broken.append(link)
    assert broken == []


def test_a_moved_cache_is_shown_at_its_default_place(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("FITPLAN_CACHE", raising=False)
    moved = f"{tmp_path}/fitplan/models/gemma-3-270m-q4_k_m.gguf: context 8192"
    assert home_as_tilde(cache_as_default(moved)) == "~/.cache/fitplan/models/gemma-3-270m-q4_k_m.gguf: context 8192"
