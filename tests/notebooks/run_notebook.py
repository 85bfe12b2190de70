"""Execute one notebook with nbclient and write it back with its outputs (run by test_notebooks.py with
the wheel venv's python, so the kernel is that python too: the kernel spec "python3" names `python`,
which jupyter_client replaces with the running interpreter).

    python -I run_notebook.py NOTEBOOK OUT WORKDIR CELL_TIMEOUT_S

A last cell, appended here, prints where `planner` and `planner.synth` were imported from and the
kernel's interpreter, so the test can check that the notebook ran on the installed wheel.
"""
from __future__ import annotations

import sys

import nbformat
from nbclient import NotebookClient

PROBE = "\n".join(("import sys", "import planner.synth", "print(planner.__file__)", "print(planner.synth.__file__)",
                   "print(sys.prefix)"))


def main(argv: list[str]) -> int:
    source, out, workdir, timeout = argv
    nb = nbformat.read(source, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    NotebookClient(nb, timeout=int(timeout), kernel_name="python3",
                   resources={"metadata": {"path": workdir}}).execute()   # raises on any cell error
    nbformat.write(nb, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
