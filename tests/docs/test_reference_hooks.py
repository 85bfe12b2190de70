"""The MkDocs hooks that render the reference pages from the code (docs/hooks/)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
import typer

from planner.cli.app import app

HOOKS = Path(__file__).resolve().parents[2] / "docs" / "hooks"


def hook(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", HOOKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_page_has_every_command_and_option() -> None:
    cli = hook("cli_reference")
    text = cli.render()
    group = typer.main.get_command(app)
    for name in group.list_commands(None):   # type: ignore[arg-type]
        command = group.get_command(None, name)   # type: ignore[arg-type]
        assert f"\n## {name}\n" in text
        section = text.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        assert f"Usage: fitplan {name} [OPTIONS]" in section
        for param in command.params:
            if param.param_type_name == "option" and not param.hidden:
                for opt in param.opts:
                    assert re.search(f"`(.*, )?{re.escape(opt)}[ ,`]", section), (name, opt)


def test_the_cli_page_keeps_brackets_literal() -> None:
    cli = hook("cli_reference")
    assert cli._text("hf://ORG/REPO[:QUANT][@REV] `[x]`") == "hf://ORG/REPO\\[:QUANT\\]\\[@REV\\] `[x]`"
    assert cli._text("prepend *=cpu, 0<=x, HF_TOKEN `a_b`") == "prepend \\*=cpu, 0&lt;=x, HF\\_TOKEN `a_b`"


def test_the_marker_is_replaced_only_where_it_stands() -> None:
    cli = hook("cli_reference")
    assert cli.on_page_markdown("# Other page\n", page=None) == "# Other page\n"
    assert cli.MARKER not in cli.on_page_markdown(f"# CLI\n\n{cli.MARKER}\n", page=None)


def test_the_inventory_tables_say_what_the_loader_requires() -> None:
    text = hook("schema_reference").inventory_schema()
    # configs/devices/README.md: host and host.ram are required, and calibrate's date, method, tool
    for key in ("host", "ram", "date", "method", "tool"):
        assert f"| `{key}` | yes |" in text
    for key in ("description", "devices", "available", "catalog", "model"):
        assert f"| `{key}` | no |" in text


@pytest.fixture(scope="module")
def schema() -> ModuleType:
    return hook("schema_reference")


def test_the_plan_document_fields_are_the_written_ones(schema: ModuleType) -> None:
    text = schema.plan_document()
    assert "| `budgets.uma_pool_bytes` | integer (optional) |" in text
    assert "| `argv` | list of strings |" in text


def test_a_field_without_a_meaning_fails_the_build(schema: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    fields = dict(schema.PLAN_FIELDS)
    del fields["ctx"]
    monkeypatch.setattr(schema, "PLAN_FIELDS", fields)
    with pytest.raises(ValueError, match="without a meaning \\['ctx'\\]"):
        schema.plan_document()


def test_a_meaning_without_a_field_fails_the_build(schema: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schema, "PLAN_FIELDS", {**schema.PLAN_FIELDS, "gone": "a field the code no longer writes"})
    with pytest.raises(ValueError, match="no longer has \\['gone'\\]"):
        schema.plan_document()


def _rows(text: str, first: str) -> dict[str, list[str]]:
    """name -> cells of a markdown table whose header's first cell is `first`."""
    table = text.split(f"| {first} |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    return {cells[0].strip("` "): [c.strip() for c in cells[1:]]
            for cells in (row.strip("|").split(" | ") for row in table)}


def test_the_coverage_page_has_a_row_per_pin_name() -> None:
    from planner.gguf.pin_lists import pin_architectures, pin_projectors
    from planner.memory.coverage import architecture_coverage, projector_coverage

    text = hook("coverage_reference").coverage_page()
    archs, projs = _rows(text, "architecture"), _rows(text, "projector type")
    assert list(archs) == list(pin_architectures()) and list(projs) == list(pin_projectors())
    for name, cells in archs.items():
        assert cells[0] == architecture_coverage(name).status.value, name
    for name, cells in projs.items():
        assert cells[0] == projector_coverage(name).status.value, name
    # the peer column, from the tests: the estimate matrix holds a llama shape; test_nextn_peer and the MoE
    # matrix (its glm45_air_spec) build glm4moe
    assert "test_estimate_peer.py" in archs["llama"][-1]
    assert archs["glm4moe"][-1] == ("`test_arch_moe_peer.py`, `test_mtp_peer.py`, `test_nextn_peer.py`, "
                                   "`test_vulkan_archs_peer.py`")
    assert archs["t5"][-1] == ""
    assert projs["gemma3"][-1] == "`test_mmproj_peer.py`"
    # every simulated architecture names the peer test that holds its rows to llama-fit-params' (the family
    # matrices name their files as shapes_<family>.<name>)
    assert archs["mistral3"][-1] == "`test_arch_dense_peer.py`, `test_vulkan_archs_peer.py`"
    unproven = [name for name, cells in archs.items() if cells[0] == "simulated" and not cells[-1]]
    assert unproven == []


def test_an_undecided_architecture_fails_the_coverage_build(monkeypatch: pytest.MonkeyPatch) -> None:
    import planner.memory.coverage as coverage

    monkeypatch.setattr(coverage, "KNOWN_DENSE", coverage.KNOWN_DENSE | {"mamba"})   # dense and recurrent at once
    with pytest.raises(ValueError, match="coverage undecided for mamba"):
        hook("coverage_reference").coverage_page()
