"""planner.sweeps.choose in-process on local files: each row is the plan of its file alone, the
recommendation the best of those plans by the stated rules."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import api
from planner.core.errors import InfeasiblePlacement
from tests.support.overhead import cuda
from tests.support.quant_repo import QUANTS, bits_per_weight, spec

BOX = {"devices": [f"CUDA0={cuda(640)}"], "ram": "4GiB", "max_ram": "160MiB"}
PICKED = ("Q2_K", "Q4_K_M", "Q8_0", "F16")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("quants")
    return {q.tag: str(spec(q).write(Path(d) / f"Model-{q.tag}.gguf")[0]) for q in QUANTS if q.tag in PICKED}


def _alone(path: str):
    try:
        return api.plan(path, BOX["devices"], ram=BOX["ram"], max_ram=BOX["max_ram"], n_ctx=8192)
    except InfeasiblePlacement:
        return None


def test_rows_are_the_plans_made_one_by_one_and_the_picks_follow_the_rules(files):
    choice = api.choose(list(files.values()), **BOX, n_ctx=8192)
    quants = {q.tag: q for q in QUANTS}
    alone = {tag: _alone(path) for tag, path in files.items()}
    assert [r.candidate.label for r in choice.rows] == [f"Model-{t}" for t in files]
    for row, tag in zip(choice.rows, files, strict=True):
        assert row.bits_per_weight == pytest.approx(bits_per_weight(quants[tag]), abs=1e-9)
        plan = alone[tag]
        assert (row.plan is None) == (plan is None)
        if plan is not None:
            assert row.plan.flags == plan.flags and row.plan.prediction == plan.prediction
    fits = [t for t in files if alone[t] is not None]
    assert fits and len(fits) < len(files)
    best = max(fits, key=lambda t: (bits_per_weight(quants[t]), alone[t].prediction.decode_tokens_s))
    fastest = max(fits, key=lambda t: alone[t].prediction.decode_tokens_s)
    assert choice.rows[choice.best].candidate.label == f"Model-{best}"
    assert choice.rows[choice.fastest].candidate.label == f"Model-{fastest}"
    assert choice.recommended.flags == alone[best].flags


def test_clients_give_slots_of_the_context_each(files, capsys):
    from planner.cli import main

    code = main(["choose", files["Q2_K"], "--device", f"CUDA0={cuda(4096)}", "--ram", "16GiB", "--ctx", "4096",
                 "--clients", "2", "--format", "json"])
    assert code == 0
    argv = json.loads(capsys.readouterr().out)["plan"]["argv"]
    assert argv[argv.index("-np") + 1] == "2" and argv[argv.index("-c") + 1] == str(2 * 4096)


def test_nothing_that_fits_is_exit_1_with_the_table(files, capsys):
    from planner.cli import main

    code = main(["choose", files["F16"], "--device", f"CUDA0={cuda(640)}", "--ram", "4GiB", "--max-ram", "160MiB",
                 "--ctx", "8192"])
    out = capsys.readouterr()
    assert code == 1 and "does not fit" in out.out
    assert out.err.strip() == "fitplan: no candidate plans under these budgets and constraints"
