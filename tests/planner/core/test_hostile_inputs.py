"""Issue #22: sizes, YAML documents, input files and output paths that a hostile or careless user
feeds fitplan are one clear BadInput, never an OverflowError, a hang or a MemoryError."""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from planner.core.errors import BadInput, InventoryError
from planner.core.units import MAX_SIZE_BYTES, GiB, TiB, parse_size, quote
from planner.system.files import MAX_DOCUMENT_BYTES, check_output_path, read_bounded, write_atomic
from planner.system.schema import MAX_YAML_DEPTH, read_yaml

# ----------------------------------------------------------------------------- sizes


def test_a_400_digit_size_is_bad_input_not_an_overflow():
    with pytest.raises(BadInput, match="larger than"):
        parse_size("9" * 400 + "GiB")
    with pytest.raises(BadInput, match="bad size"):
        parse_size("1e400")             # no exponent form at all
    assert parse_size(f"{MAX_SIZE_BYTES // TiB}TiB") == MAX_SIZE_BYTES   # 2^62 is the limit itself
    with pytest.raises(BadInput, match="larger than"):
        parse_size(f"{MAX_SIZE_BYTES // TiB + 1}TiB")


@pytest.mark.parametrize("text", ["٨GiB", "٣٢", "8GiB\u0660", "１６GiB"])   # Arabic-Indic and full-width digits
def test_non_ascii_digits_are_refused(text):
    with pytest.raises(BadInput):
        parse_size(text)


def test_sizes_still_parse():
    assert parse_size("24GiB") == 24 * GiB and parse_size("6") == 6 * GiB and parse_size("-2") == -2 * GiB


def test_quote_bounds_what_a_message_repeats():
    assert len(quote("x" * 10**6)) <= 80
    assert quote(list(range(10**6))) == "<a list of 1000000 items>"
    assert "digits" in quote(10**5000) and len(quote(10**5000)) <= 80
    assert quote("CUDA0") == "'CUDA0'"


# ----------------------------------------------------------------------------- YAML documents


def _yaml(tmp_path, text: str):
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    return read_yaml(path)


def test_billion_laughs_is_refused_before_it_expands(tmp_path):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    started = time.monotonic()
    with pytest.raises(InventoryError, match="more than 100000 values once its aliases are expanded"):
        _yaml(tmp_path, "\n".join(lines) + "\n")
    assert time.monotonic() - started < 5


def test_cycles_and_deep_nesting_are_refused_and_shared_values_still_load(tmp_path):
    with pytest.raises(InventoryError, match="self-referencing"):
        _yaml(tmp_path, "a: &a [*a]\n")
    shared = [1, 2]
    assert _yaml(tmp_path, yaml.safe_dump({"c": shared, "d": shared})) == {"c": [1, 2], "d": [1, 2]}  # &id001
    with pytest.raises(InventoryError, match=f"nested more than {MAX_YAML_DEPTH}"):
        _yaml(tmp_path, "[" * 100_000 + "]" * 100_000)
    inner = MAX_YAML_DEPTH - 1                  # the mapping is one level
    assert _yaml(tmp_path, "a: " + "[" * inner + "]" * inner) == {"a": _nest(inner - 1)}


def _nest(n: int) -> list:
    return [] if n == 0 else [_nest(n - 1)]


def test_a_5000_digit_integer_is_bad_input(tmp_path):
    with pytest.raises(InventoryError, match="not a usable YAML document"):
        _yaml(tmp_path, "host: {ram: " + "9" * 5000 + "}\n")


# ----------------------------------------------------------------------------- input files


def test_a_fifo_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "devices.yaml"
    os.mkfifo(fifo)
    old = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("open() blocked")))
    signal.alarm(5)
    try:
        with pytest.raises(InventoryError, match="is a FIFO"):
            read_yaml(fifo)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("path, kind", [("/dev/zero", "character device"), ("/dev/urandom", "character device"),
                                        ("/", "directory")])
def test_special_files_are_refused(path, kind):
    with pytest.raises(BadInput, match=kind):
        read_bounded(path)


def test_reads_are_bounded(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(MAX_DOCUMENT_BYTES + 1)
    with pytest.raises(BadInput, match="at most"):
        read_bounded(big)
    small = tmp_path / "small"
    small.write_bytes(b"12345")
    with pytest.raises(BadInput, match="at most 4 bytes"):
        read_bounded(small, limit=4)
    assert read_bounded(small) == b"12345"


# ----------------------------------------------------------------------------- output paths


@pytest.mark.parametrize("path, message", [
    ("", "empty"), ("   ", "empty"), ("/", "is a directory"), (".", "is a directory"), ("..", "is a directory"),
    ("sub/", "is a directory"), ("/dev/null", "not a regular file"), ("missing/x.yaml", "no such directory"),
    ("a" * 300 + ".yaml", "file name is 305 bytes"), ("/".join(["d" * 200] * 30), "cannot write there"),
])
def test_output_paths_that_cannot_be_a_file_are_bad_input(tmp_path, monkeypatch, path, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    with pytest.raises(BadInput, match=message):
        check_output_path(path)
    with pytest.raises(BadInput, match=message):
        write_atomic(path, lambda tmp: tmp.write_text("x"))


def test_an_existing_directory_is_not_replaced(tmp_path):
    with pytest.raises(BadInput, match="is a directory"):
        write_atomic(tmp_path, lambda tmp: tmp.write_text("x"))
    assert tmp_path.is_dir()


def test_a_name_of_250_characters_is_written(tmp_path):
    target = tmp_path / ("a" * 245 + ".yaml")        # the temporary beside it is shortened, not the target
    write_atomic(target, lambda tmp: tmp.write_text("whole"))
    assert target.read_text() == "whole" and [p.name for p in tmp_path.iterdir()] == [target.name]


def test_a_failed_write_or_rename_is_one_line_and_leaves_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "plan.yaml"
    target.write_text("old")

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(BadInput, match="cannot write the file \\(Permission denied\\)"):
        write_atomic(target, lambda tmp: tmp.write_text("new"))
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["plan.yaml"]


def _write_into_read_only(ro: Path) -> None:
    with pytest.raises(BadInput, match="cannot write the file"):
        write_atomic(ro / "x.yaml", lambda tmp: tmp.write_text("x"))


def test_a_read_only_directory_is_bad_input(tmp_path):
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        try:
            _write_into_read_only(ro)
        finally:
            ro.chmod(0o755)
        return
    # as root a mode stops no write: the check runs in a forked child that gives up root for nobody
    # (the interpreter is already loaded, so nothing has to be readable by nobody but the directory)
    base = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        base.chmod(0o755)
        ro = base / "ro"
        ro.mkdir(mode=0o555)
        pid = os.fork()
        if pid == 0:   # the child: exit 0 only if the write was refused as bad input
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                _write_into_read_only(ro)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert list(ro.iterdir()) == []
    finally:
        shutil.rmtree(base)
