"""`fitplan plan-set`: the set file's named errors (exit 2), resident and on-demand models planned
within what the others leave (their rows add up within every budget), the rpc-servers one process
holds kept from the others, and infeasible sets (exit 1) whose suggestions, applied to the file and
planned again, fit: one test per kind of suggestion."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from planner.cli import main
from planner.gguf.reader import read_model
from tests.support.model_sets import set_files
from tests.support.overhead import CUDA_MIB

MIB = 2**20
HOST_ONLY = ["--ram", "3GiB"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """The bundled Gemma 3 270M, a small gemma3 chat model with its vocabulary, a tiny BERT encoder."""
    d = tmp_path_factory.mktemp("sets")
    made = set_files(d)
    return {"gemma": made.gemma, "small": made.small, "embed": made.embed, "dir": str(d)}


def _write(files: dict[str, str], name: str, models: dict) -> str:
    path = Path(files["dir"]) / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"models": models}))
    return str(path)


def _run(capsys, argv: list[str]) -> tuple[int, dict]:
    capsys.readouterr()
    rc = main([*argv, "--format", "json"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


# --- the file's errors -----------------------------------------------------------------------------

@pytest.mark.parametrize(("models", "says"), [
    ({"chat": {"model": "x.gguf", "contxt": 4096}}, "models.chat.contxt: unknown key (did you mean 'ctx'?)"),
    ({"chat": {"model": "x.gguf", "resident": "sometimes"}}, "models.chat.resident: expected one of always, auto"),
    ({"chat": {"model": "x.gguf", "slots": 0}}, "models.chat.slots: expected slots (a positive whole number)"),
    ({"chat": {"model": "x.gguf", "cache_type": "q3"}}, "models.chat.cache_type: expected one of"),
    ({"chat": {"ctx": 4096}}, "models.chat.model: missing"),
    ({"bad name": {"model": "x.gguf"}}, "models: expected a model name"),
    ({"a": {"model": "x.gguf", "group": "g", "resident": "always"},
      "b": {"model": "x.gguf", "group": "g", "resident": "on-demand"}}, "group 'g' mixes resident: always, on-demand"),
    ({"a": {"model": "x.gguf"}, "b": {"model": "x.gguf", "group": "a"}},
     "models.b.group: 'a' is the name of a model outside the group"),
    ({"a": {"model": "x.gguf", "priority": 1.5}}, "models.a.priority: expected an integer"),
    ({"a": {"model": "x.gguf"}}, None),
])
def test_wrong_file_is_one_line_and_exit_2(files, capsys, models, says):
    if says is None:   # the model file itself missing: the reference's own error
        models = {"a": {"model": str(Path(files["dir"]) / "missing.gguf")}}
        says = "missing.gguf: no such file"
    path = _write(files, "wrong", models)
    capsys.readouterr()
    assert main(["plan-set", path, *HOST_ONLY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fitplan: error: ") and says in err[0], err


def test_wrong_top_key_and_document(files, capsys):
    path = Path(files["dir"]) / "top.yaml"
    path.write_text("modles: {}\n")
    rc, doc = _run(capsys, ["plan-set", str(path), *HOST_ONLY])
    assert rc == 2 and doc["error"]["code"] == "bad_set" and "did you mean 'models'" in doc["error"]["message"]


# --- a set that fits -------------------------------------------------------------------------------

def _rows_within_budgets(doc: dict) -> None:
    """Every set's rows: each model's bytes as its own plan has them, summed, within the budget."""
    plans = {m["name"]: m for m in doc["models"]}
    for state in doc["sets"]:
        for row in state["devices"]:
            for name, n in row["models"].items():
                own = [d["total_bytes"] + d["overhead_bytes"] for d in plans[name]["devices"]
                       if d["name"] == row["name"] or (row["name"] == "Host" and d["name"] == "CPU_REPACK")]
                assert n == sum(own)
            assert row["total_bytes"] == sum(row["models"].values())
            if row["budget_bytes"] is not None:
                assert row["total_bytes"] <= row["budget_bytes"], (state["name"], row)


def test_resident_and_on_demand_on_rpc_servers(files, capsys):
    path = _write(files, "three", {
        "chat": {"model": files["gemma"], "ctx": 2048, "resident": "always", "priority": 10},
        "embed": {"model": files["embed"], "role": "embedding", "ctx": 512, "resident": "always"},
        "small": {"model": files["small"], "ctx": 1024, "resident": "on-demand"}})
    devices = [a for i in range(3) for a in ("--device", f"RPC{i}=1GiB@127.0.0.1:{50100 + i}")]
    rc, doc = _run(capsys, ["plan-set", path, *devices, "--ram", "4GiB"])
    assert rc == 0, doc
    models = {m["name"]: m for m in doc["models"]}
    assert [models[n]["resident"] for n in ("chat", "embed", "small")] == [True, True, False]
    assert "--embeddings" in models["embed"]["argv"] and "--embeddings" not in models["chat"]["argv"]
    # a ggml-rpc-server serves one client: no two models loaded together name the same endpoint
    endpoints = {n: set(m["argv"][m["argv"].index("--rpc") + 1].split(",")) if "--rpc" in m["argv"] else set()
                 for n, m in models.items()}
    assert not endpoints["chat"] & endpoints["embed"] and not endpoints["chat"] & endpoints["small"]
    assert not endpoints["embed"] & endpoints["small"]
    assert [s["models"] for s in doc["sets"]] == [["chat", "embed"], ["chat", "embed", "small"]]
    [od] = doc["on_demand"]
    assert od["unit"] == "small" and od["evicts"] == [] and od["load_seconds"] is None
    assert od["load_bytes"] == read_model(files["small"]).total_tensor_bytes
    _rows_within_budgets(doc)


def test_auto_model_that_does_not_fit_goes_on_demand(files, capsys):
    # two auto models at 4096 tokens each: the first (higher priority) stays, the second does not fit
    # beside it in 520 MiB, and is planned on demand against what the first leaves
    path = _write(files, "auto", {
        "a": {"model": files["small"], "ctx": 4096, "priority": 1},
        "b": {"model": files["small"], "ctx": 4096},
        "c": {"model": files["small"], "ctx": 4096}})
    rc, doc = _run(capsys, ["plan-set", path, *HOST_ONLY, "--max-ram", "400MiB"])
    assert rc == 0, doc
    resident = [m["name"] for m in doc["models"] if m["resident"]]
    demoted = [m["name"] for m in doc["models"] if m["demoted"]]
    assert resident[0] == "a" and demoted and set(resident) | set(demoted) == {"a", "b", "c"}
    for od in doc["on_demand"]:
        assert od["evicts"] == [o["unit"] for o in doc["on_demand"] if o is not od]
    _rows_within_budgets(doc)


# --- infeasible sets: each suggestion, applied and planned again, fits --------------------------------

def _apply(models: dict, s: dict) -> dict:
    models = {k: dict(v) for k, v in models.items()}
    entry = models[s["model"]]
    if s["kind"] == "ctx":
        entry["ctx"] = s["n_ctx"]
    elif s["kind"] == "cache_type":
        entry["cache_type"] = s["cache_type"]
    elif s["kind"] == "slots":
        entry["slots"] = s["slots"]
    else:
        assert s["kind"] == "on-demand"
        entry["resident"] = "on-demand"
    return models


def _suggested(files, capsys, name: str, models: dict, budget: list[str], kind: str) -> None:
    path = _write(files, name, models)
    rc, doc = _run(capsys, ["plan-set", path, *budget])
    assert rc == 1 and doc["error"]["code"] == "infeasible", doc
    found = [s for s in doc["error"]["suggestions"] if s["kind"] == kind]
    assert found, doc["error"]
    for s in doc["error"]["suggestions"]:   # every one shown fits, re-planned as a whole set
        rc, fixed = _run(capsys, ["plan-set", _write(files, f"{name}-{s['kind']}", _apply(models, s)), *budget])
        assert rc == 0, (s, fixed)
        _rows_within_budgets(fixed)


def test_suggestion_smaller_context(files, capsys):
    models = {"chat": {"model": files["gemma"], "ctx": 32768, "resident": "always"}}
    _suggested(files, capsys, "ctx", models, [*HOST_ONLY, "--max-ram", "500MiB"], "ctx")


def test_suggestion_quantized_cache(files, capsys):
    models = {"chat": {"model": files["gemma"], "ctx": 32768, "resident": "always"}}
    _suggested(files, capsys, "cache", models, [*HOST_ONLY, "--max-ram", "500MiB"], "cache_type")


def test_suggestion_fewer_slots(files, capsys):
    models = {"chat": {"model": files["gemma"], "ctx": 8192, "slots": 4, "resident": "always"}}
    _suggested(files, capsys, "slots", models, [*HOST_ONLY, "--max-ram", "500MiB"], "slots")


def test_suggestion_on_demand(files, capsys):
    # chat, b and the on-demand d do not fit at once; b moved on demand swaps with d instead
    models = {"chat": {"model": files["small"], "ctx": 4096, "resident": "always", "priority": 5},
              "b": {"model": files["small"], "ctx": 4096, "resident": "always"},
              "d": {"model": files["small"], "ctx": 4096, "resident": "on-demand"}}
    _suggested(files, capsys, "on-demand", models, [*HOST_ONLY, "--max-ram", "450MiB"], "on-demand")


def test_on_demand_group_loads_together_and_load_seconds(files, capsys):
    # a group of two on demand: one unit, both members beside the resident model, on rpc-servers no
    # other process of that state holds; its load reads both files' tensors at disk_read bytes a second
    path = Path(files["dir"]) / "group.yaml"
    path.write_text(yaml.safe_dump({"disk_read": "512MiB", "models": {
        "chat": {"model": files["gemma"], "ctx": 2048, "resident": "always"},
        "a": {"model": files["small"], "ctx": 1024, "resident": "on-demand", "group": "pair"},
        "b": {"model": files["small"], "ctx": 1024, "resident": "on-demand", "group": "pair"},
        "solo": {"model": files["small"], "ctx": 1024, "resident": "on-demand"}}}))
    devices = [a for i in range(4) for a in ("--device", f"RPC{i}=200MiB@127.0.0.1:{50300 + i}")]
    rc, doc = _run(capsys, ["plan-set", str(path), *devices, "--ram", "4GiB"])
    assert rc == 0, doc
    units = {o["unit"]: o for o in doc["on_demand"]}
    assert units["pair"]["models"] == ["a", "b"] and units["pair"]["evicts"] == ["solo"]
    assert units["solo"]["evicts"] == ["pair"]
    n_bytes = 2 * read_model(files["small"]).total_tensor_bytes
    assert units["pair"]["load_bytes"] == n_bytes
    assert units["pair"]["load_seconds"] == round(n_bytes / (512 * MIB), 3)
    state = next(s for s in doc["sets"] if s["models"] == ["chat", "a", "b"])
    models = {m["name"]: m for m in doc["models"]}
    held = [set(models[n]["argv"][models[n]["argv"].index("--rpc") + 1].split(","))
            for n in state["models"] if "--rpc" in models[n]["argv"]]
    assert sum(len(h) for h in held) == len(set().union(*held))   # no rpc-server twice in one state
    _rows_within_budgets(doc)


def test_html_page_for_a_set_and_for_one_that_does_not_fit(files, capsys, tmp_path):
    path = _write(files, "html", {
        "chat": {"model": files["gemma"], "ctx": 2048, "resident": "always"},
        "small": {"model": files["small"], "ctx": 1024, "resident": "on-demand"}})
    page = tmp_path / "set.html"
    assert main(["plan-set", path, *HOST_ONLY, "--html", str(page)]) == 0
    text = page.read_text()
    assert text.count("<h2>Loaded together: ") == 2 and "Loaded together: chat, small" in text
    assert 'id="model-chat"' in text and 'id="model-small"' in text and text.count('id="layers"') == 2
    bad = tmp_path / "bad.html"
    assert main(["plan-set", path, *HOST_ONLY, "--max-ram", "200MiB", "--html", str(bad)]) == 1
    assert "does not fit" in bad.read_text() and 'id="what-fits"' in bad.read_text()


def test_serve_dry_run_of_a_set_prints_the_router(files, capsys, tmp_path):
    path = _write(files, "serve", {
        "chat": {"model": files["gemma"], "ctx": 2048, "resident": "always"},
        "small": {"model": files["small"], "ctx": 1024, "resident": "on-demand"}})
    doc = tmp_path / "set-plan.yaml"
    assert main(["plan-set", path, *HOST_ONLY, "-o", str(doc)]) == 0
    capsys.readouterr()
    assert main(["serve", str(doc), "--dry-run", "--llama-bin", str(tmp_path), "--port", "9000"]) == 2   # no binary
    capsys.readouterr()
    (tmp_path / "llama-server").write_text("")
    assert main(["serve", str(doc), "--dry-run", "--llama-bin", str(tmp_path), "--port", "9000"]) == 0
    argv = shlex.split(capsys.readouterr().out)
    assert argv[0] == str(tmp_path / "llama-server")
    preset = Path(argv[argv.index("--models-preset") + 1])
    assert argv[argv.index("--models-max") + 1] == "2" and argv[-4:] == ["--host", "127.0.0.1", "--port", "9000"]
    assert "[chat]" in preset.read_text() and "[small]" in preset.read_text()
    assert main(["serve", str(doc), "--dry-run", "--", "-c", "4096"]) == 2   # flags belong to the plan
    capsys.readouterr()
    assert main(["serve", str(doc), "--dry-run", "--max-vram", "1GiB"]) == 2
    assert "--max-vram: a set plan is served as planned" in capsys.readouterr().err


def test_export_of_a_set_plan_is_what_plan_set_prints(files, capsys, tmp_path):
    path = _write(files, "export", {
        "chat": {"model": files["gemma"], "ctx": 2048, "resident": "always"},
        "small": {"model": files["small"], "ctx": 1024, "resident": "on-demand"}})
    doc = tmp_path / "set-plan.json"
    for to in ("preset", "llama-swap"):
        capsys.readouterr()
        assert main(["plan-set", path, *HOST_ONLY, "-o", str(doc), "--format", to, "--llama-bin", str(tmp_path)]) == 0
        printed = capsys.readouterr().out
        assert main(["export", str(doc), "--to", to, "--llama-bin", str(tmp_path)]) == 0
        assert capsys.readouterr().out == printed
    assert main(["export", str(doc), "--to", "systemd"]) == 2
    assert "a set plan exports as one of preset, llama-swap" in capsys.readouterr().err


def test_a_model_with_its_drafter(files, capsys):
    # the drafter is the model's companion: placed with it in one process, its rows in the model's
    path = _write(files, "draft", {"chat": {"model": files["gemma"], "ctx": 2048, "draft": files["small"],
                                            "resident": "always"}})
    rc, doc = _run(capsys, ["plan-set", path, *HOST_ONLY])
    assert rc == 0, doc
    [chat] = doc["models"]
    assert chat["argv"][chat["argv"].index("-md") + 1] == files["small"]
    rc, alone = _run(capsys, ["plan", files["gemma"], "--ram", "3GiB", "--ctx", "2048", "--draft", files["small"]])
    assert rc == 0 and chat["devices"] == alone["devices"]   # as `fitplan plan --draft` plans it


def test_an_always_model_that_needs_the_first_choice_gets_it(files, capsys):
    # the Gemma model first (priority) leaves the small one too little; the small one first leaves Gemma
    # enough: the order that fits is kept, and each model's rows are within what the other left
    models = {"gemma": {"model": files["gemma"], "ctx": 8192, "resident": "always", "priority": 10},
              "small": {"model": files["small"], "ctx": 4096, "resident": "always"}}
    # two processes on CUDA0: each holds its own CUDA overhead beside the 350 MiB of rows they share
    budget = ["--device", f"CUDA0={1024 + 2 * CUDA_MIB}MiB", "--ram", "4GiB", "--max-vram",
              f"{350 + 2 * CUDA_MIB}MiB", "--max-ram", "350MiB"]
    rc, doc = _run(capsys, ["plan-set", _write(files, "order", models), *budget])
    assert rc == 0, doc
    _rows_within_budgets(doc)
    # the small model placed first: its rows' budgets are the whole box's
    small = next(m for m in doc["models"] if m["name"] == "small")
    assert {d["name"]: d["budget_bytes"] for d in small["devices"] if d["budget_bytes"] is not None} == \
        {"CUDA0": (350 + 2 * CUDA_MIB) * MIB, "Host": 350 * MIB}
