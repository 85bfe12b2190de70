"""`fitplan sd-fit … --format json` run in-process, for the CLI tests."""
from __future__ import annotations

import json

from planner.cli import main


def sd_fit_json(capsys, *args: str) -> dict:
    """The JSON plan sd-fit prints for `args` (the run must exit 0)."""
    code = main(["sd-fit", *args, "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)
