"""Re-extract the pinned llama.cpp's architecture and projector names into planner/gguf/data.

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d /tmp/lcp
    tar xzf /tmp/lcp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcp
    python scripts/pin_lists.py /tmp/lcp/llama_cpp_python-0.3.36

Reads src/llama-arch.cpp's LLM_ARCH_NAMES and tools/mtmd/clip-impl.h's PROJECTOR_TYPE_NAMES from the
unpacked sdist (its vendor/llama.cpp) and writes one name a line, in the pin's order, under a header
line naming the file, the table and the commit. Moving the pin is: download the new sdist, run this,
commit the two files (tests/planner/memory/test_coverage.py then names every architecture the
coverage table does not decide).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "planner" / "gguf" / "data"
ARCH_FILE, ARCH_TABLE = "src/llama-arch.cpp", "LLM_ARCH_NAMES"
PROJ_FILE, PROJ_TABLE = "tools/mtmd/clip-impl.h", "PROJECTOR_TYPE_NAMES"
# llama-quantize's dummy and the enum's sentinel: names llama.cpp loads no model for
ARCH_LEFT_OUT = ("clip", "(unknown)")
_ENTRY = re.compile(r'\{\s*([A-Z0-9_]+)\s*,\s*"([^"]*)"\s*\}')


def table_names(source: str, table: str) -> list[str]:
    """The string of each `{ ENUM, "name" }` entry of the C++ map `table`, in source order."""
    start = source.find(f"{table} = {{")
    if start < 0:
        raise ValueError(f"table {table} not found")
    end = source.find("};", start)
    if end < 0:
        raise ValueError(f"table {table} has no end")
    names = [m.group(2) for m in _ENTRY.finditer(source, start, end)]
    if not names:
        raise ValueError(f"table {table} has no entries")
    return names


def _commit(llama_cpp: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(llama_cpp), "rev-parse", "--short=7", "HEAD"],
                             capture_output=True, text=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def render(names: list[str], file: str, table: str, commit: str, note: str = "") -> str:
    return f"# {file} {table}, llama.cpp {commit}{note}\n" + "".join(f"{n}\n" for n in names)


def extract(sdist: Path, commit: str | None = None) -> dict[str, str]:
    """File name -> contents, for an unpacked llama-cpp-python sdist (or a llama.cpp checkout)."""
    llama_cpp = sdist / "vendor" / "llama.cpp" if (sdist / "vendor" / "llama.cpp").is_dir() else sdist
    commit = commit or _commit(llama_cpp)
    archs = [n for n in table_names((llama_cpp / ARCH_FILE).read_text(), ARCH_TABLE) if n not in ARCH_LEFT_OUT]
    projs = table_names((llama_cpp / PROJ_FILE).read_text(), PROJ_TABLE)
    left_out = ", ".join(f'"{n}"' for n in ARCH_LEFT_OUT)
    return {"pin_architectures.txt": render(archs, ARCH_FILE, ARCH_TABLE, commit, f", less {left_out}"),
            "pin_projectors.txt": render(projs, PROJ_FILE, PROJ_TABLE, commit)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sdist", type=Path, help="the unpacked llama-cpp-python sdist (or a llama.cpp checkout)")
    ap.add_argument("--commit", help="llama.cpp's commit, where the source is not a git checkout")
    ap.add_argument("--out", type=Path, default=DATA, help=f"where the lists go (default: {DATA})")
    args = ap.parse_args(argv)
    try:
        files = extract(args.sdist, args.commit)
    except (OSError, ValueError) as e:
        print(f"pin_lists: error: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (args.out / name).write_text(text)
        print(f"{args.out / name}: {len(text.splitlines()) - 1} names")
    return 0


if __name__ == "__main__":
    sys.exit(main())
