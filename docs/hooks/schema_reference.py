"""MkDocs hook: the inventory schema and the plan document, rendered from the code.

- `<!-- fitplan:inventory-schema -->` becomes one table per section of the inventory YAML, its
  keys and their meanings read from the tables `planner.hardware.inventory_yaml` validates with
  (the same text its error messages quote). "required" is found by asking the loader: a key is
  required when a minimal valid document without it is refused as missing.
- `<!-- fitplan:plan-document -->` becomes the fields of the deployment document `fitplan plan -o`
  writes, found by planning the bundled example on two inventories (a discrete-GPU workstation and
  a UMA APU, so the optional pool fields appear), with each field's type as written. The meanings
  are the one hand-written part and are checked both ways: a field the code writes without a
  meaning here, or a meaning for a field it no longer writes, fails the build.
"""
from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import yaml

INVENTORY_MARKER = "<!-- fitplan:inventory-schema -->"
PLAN_MARKER = "<!-- fitplan:plan-document -->"
ROOT = Path(__file__).resolve().parents[2]
PLAN_INVENTORIES = ("configs/devices/workstation-2x3090.yaml", "configs/devices/strix-halo.yaml")
PLAN_MODEL = "example:gemma3-270m"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if INVENTORY_MARKER in markdown:
        markdown = markdown.replace(INVENTORY_MARKER, inventory_schema())
    if PLAN_MARKER in markdown:
        markdown = markdown.replace(PLAN_MARKER, plan_document())
    return markdown


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


# ----------------------------------------------------------------------------- the inventory

def inventory_schema() -> str:
    from planner.hardware import inventory_yaml as iy

    minimal_host = {"ram": "64GiB"}
    minimal_calibrated = {"date": "2026-01-01", "method": "m", "tool": "t"}
    sections = [
        ("Top level", iy._TOP_KEYS, {"host": minimal_host}, lambda d: d),
        ("`host`", iy._HOST_KEYS, minimal_host, lambda d: {"host": d}),
        ("`devices[]`", iy._DEVICE_KEYS, None, None),
        ("`calibrated`", iy._CALIBRATED_KEYS, minimal_calibrated, lambda d: {"host": minimal_host, "calibrated": d}),
    ]
    out = []
    for title, keys, minimal, wrap in sections:
        required = _required(minimal, wrap) if minimal is not None and wrap is not None else set()
        out += [f"### {title}", "", "| key | required | meaning |", "| --- | --- | --- |"]
        out += [f"| `{key}` | {'yes' if key in required else 'no'} | {_cell(meaning)} |"
                for key, meaning in keys.items()]
        out.append("")
    out += ["### Calibrated figures", "",
            "Under `calibrated.host` and `calibrated.devices.NAME`, each figure is a mapping "
            f"`{{{', '.join(iy._VALUE_KEYS)}}}` ({'; '.join(f'`{k}`: {v}' for k, v in iy._VALUE_KEYS.items())}).", "",
            "| key | unit | what fitplan uses it as |", "| --- | --- | --- |"]
    for key, (quantity, _scale) in iy.CALIBRATED_FIGURES.items():
        suffix = key.rsplit("_", 1)[1]
        out.append(f"| `{key}` | {UNITS.get(suffix, suffix)} | `{quantity.name}` |")
    out.append("")
    return "\n".join(out)


# the unit a calibrated figure's key ends in, as a reader writes it
UNITS = {"gbs": "GB/s", "tflops": "TFLOPS", "us": "µs", "mcells": "millions of (head, cell) pairs/s",
         "gvalues": "billions of K/V values/s"}


def _required(minimal: dict[str, Any], wrap: Any) -> set[str]:
    """The keys of `minimal` the loader reports as missing when each is left out in turn."""
    from planner.core.errors import InventoryError
    from planner.hardware.inventory_yaml import load_inventory

    required = set()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "inventory.yaml"
        path.write_text(yaml.safe_dump(wrap(minimal)))
        load_inventory(path)            # the minimal document itself must load
        for key in minimal:
            path.write_text(yaml.safe_dump(wrap({k: v for k, v in minimal.items() if k != key})))
            try:
                load_inventory(path)
            except InventoryError as e:
                if f"{key}: missing" in str(e):
                    required.add(key)
    return required


# ----------------------------------------------------------------------------- the plan document

# What each field of the deployment document means; paths as `_fields` names them.
PLAN_FIELDS = {
    "fitplan_deployment": "the document's format version",
    "llama_cpp": "the llama.cpp build the plan was made for (the pin)",
    "model.path": "the model as llama.cpp is given it (a local path or a URL)",
    "model.header_sha256": "SHA-256 of the GGUF header read; `validate` warns when the file changed",
    "inventory": "the devices and host the plan was made for, sizes in bytes and rates in bytes/s and FLOP/s "
                 "(`validate` and `serve` read it back instead of detecting)",
    "inventory.devices[]": "one device as fitplan holds it (fields below)",
    "inventory.host": "the host as fitplan holds it (fields below)",
    "budgets.devices": "device name → the budget in bytes the plan was made under",
    "budgets.host_bytes": "the host's budget in bytes",
    "budgets.uma_pool_bytes": "with UMA devices: what Host and those devices may hold together, in bytes",
    "budgets.pool_devices": "with UMA devices: the devices that share the pool with Host",
    "flags": "the llama.cpp flags as one string (kept for older readers; use `argv`)",
    "argv": "llama-server's argument vector: `-m MODEL` (or `-mu URL`) then the flags; what readers use",
    "llama_bench_flags": "the llama-bench flags that measure the plan, as one string (empty when it cannot)",
    "llama_bench_argv": "the same as an argument vector, or null when llama-bench cannot express the plan",
    "llama_bench_note": "why llama-bench cannot measure it, or what differs (empty when nothing)",
    "ctx": "the context size (tokens) over all slots",
    "devices[]": "one row per device in llama.cpp's memory breakdown, plus Host",
    "devices[].name": "llama.cpp's device name (`CUDA0`, `RPC0`, `Host`, `CPU_REPACK`)",
    "devices[].model_bytes": "weights on the device",
    "devices[].context_bytes": "KV cache and recurrent state on the device",
    "devices[].compute_bytes": "the compute buffer (how it was obtained: `compute_model`)",
    "devices[].total_bytes": "the sum of the three",
    "devices[].overhead_bytes": "what the process holds on the device outside llama.cpp's breakdown (its GPU "
                                "context, BLAS workspace, pool); the budget holds it with `total_bytes`",
    "devices[].budget_bytes": "the device's budget (null for rows without one, e.g. CPU_REPACK)",
    "devices[].layers": "the repeating layers (blk.N) the device holds",
    "devices[].output_layer": "whether the device holds the output layer",
    "predicted.decode_tokens_s": "predicted decode speed, tokens/s",
    "predicted.prefill_tokens_s": "predicted prompt-processing speed, tokens/s",
    "predicted.assumed_rates": "true when some device's rates were unknown and assumed figures were used",
    "predicted.rate_sources": "which sources the rates came from, best first: `calibrated` (fitplan calibrate), "
                              "`stated` (the inventory or catalog), `assumed` (fallbacks)",
    "predicted.boundaries_per_token": "device boundaries a decoded token crosses",
    "compute_model": "how the compute figures were obtained: `simulated` (the runtime's reserve) or `formula`",
}


def plan_document() -> str:
    from planner import api
    from planner.emit.document import DEPLOYMENT_VERSION, deployment
    from planner.hardware.inventory import DeviceSpec, HostSpec

    documents = [_fields(deployment(api.plan(PLAN_MODEL, str(ROOT / inventory)))) for inventory in PLAN_INVENTORIES]
    seen: dict[str, set[str]] = {}
    for fields in documents:
        for path, kind in fields:
            seen.setdefault(path, set()).add(kind)
    for fields in documents:
        present = {path for path, _ in fields}
        for path in set(seen) - present:
            seen[path].add("absent")
    missing = sorted(set(seen) - set(PLAN_FIELDS))
    stale = sorted(set(PLAN_FIELDS) - set(seen))
    if missing or stale:
        raise ValueError(f"docs/hooks/schema_reference.py PLAN_FIELDS is out of date: fields without a meaning "
                         f"{missing}, meanings of fields the plan document no longer has {stale}")
    out = [f"Format version {DEPLOYMENT_VERSION}.", "", "| field | type | meaning |", "| --- | --- | --- |"]
    for path, meaning in PLAN_FIELDS.items():
        kinds = seen[path] - {"absent"}
        if len(kinds) > 1:
            kinds.discard("list of values")     # an empty list beside a typed one
        optional = " (optional)" if "absent" in seen[path] else ""
        out.append(f"| `{path}` | {' or '.join(sorted(kinds))}{optional} | {_cell(meaning)} |")
    for title, cls in (("inventory.devices[]", DeviceSpec), ("inventory.host", HostSpec)):
        out += ["", f"`{title}` holds the fields of `{cls.__module__}.{cls.__name__}` (enums as their values):", "",
                "| field | type |", "| --- | --- |"]
        out += [f"| `{f.name}` | `{_cell(f.type)}` |" for f in dataclasses.fields(cls)]
    return "\n".join(out) + "\n"


def _fields(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(path, type) of every field down to the level PLAN_FIELDS describes: the inventory's devices and
    host are one field each; lists of mappings are `name[]`, their keys `name[].key`."""
    out: list[tuple[str, str]] = []
    for key, value in doc.items():
        if key == "inventory":
            out += [("inventory", "mapping"), ("inventory.devices[]", "list of mappings"),
                    ("inventory.host", "mapping")]
        elif key in ("budgets", "model", "predicted"):
            out += [(f"{key}.{k}", _kind(v)) for k, v in value.items()]
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            out.append((f"{key}[]", "list of mappings"))
            out += [(f"{key}[].{k}", _kind(v)) for row in value for k, v in row.items()]
        else:
            out.append((key, _kind(value)))
    return out


# a YAML value's Python type -> the word the page uses; bool before int (a bool is an int)
_KINDS: tuple[tuple[type, str], ...] = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
                                        (dict, "mapping"))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "list of " + (_kind(value[0]) + "s" if value else "values")
    return next((word for kind, word in _KINDS if isinstance(value, kind)), type(value).__name__)
