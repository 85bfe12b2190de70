"""A set plan's document as what serves it: a llama-server router preset or a llama-swap configuration.

- preset: the INI the pinned llama-server reads with `--models-preset` in router mode (common/preset.cpp,
  tools/server/server-models.cpp): a section per model named as the set names it (requests route by
  it), keys are option names without dashes (planning/exports.py preset_options), `load-on-startup`
  true for the resident models. The router caps how many instances run with `--models-max` (its own
  flag, on its command line: the header says it) and unloads the least recently used idle one to make
  room; the pin has no way to keep a model loaded (its preset option `pin` is commented out), so with
  more than one on-demand unit a resident model may be the one unloaded. llama-swap can say it.
- llama-swap: `models` (id -> `cmd` with `${PORT}`, `proxy`, `env`), `groups` (llama-swap's
  internal/config/config.go GroupConfig; internal/router/group.go EvictionFor): the resident models in
  one group with swap false (they run together), exclusive false (loading one unloads nothing) and
  persistent true (no other group unloads them); each on-demand unit in a group of its own with swap
  false and exclusive true (loading it unloads every other non-persistent group: the other on-demand
  units); `hooks.on_startup.preload` loads the resident models at start.
"""
from __future__ import annotations

import shlex
from typing import Any

import yaml

from planner.core.errors import BadInput
from planner.emit.document import Deployment
from planner.emit.exports import environment, preset_options, preset_value
from planner.emit.set_document import EMBEDDINGS
from planner.hardware.inventory import inventory_from_dict
from planner.llama.flags import LlamaFlags, arg, flag_key
from planner.search.set_input import RESERVED_GROUP as RESIDENT_GROUP
from planner.system.llama_tools import LLAMA_CPP_PIN

PORT_MACRO = "${PORT}"   # llama-swap assigns each model's port (config.example.yaml: startPort, ${PORT})


def _resident(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in doc["models"] if m["resident"]]


def models_max(doc: dict[str, Any]) -> int:
    """The router's --models-max: the resident models and the largest on-demand unit."""
    return len(_resident(doc)) + max((len(o["models"]) for o in doc["on_demand"]), default=0)


def _split(m: dict[str, Any]) -> tuple[str, list[str], bool]:
    """A model's argv as (model key, flags without the model pair and --embeddings, embeddings)."""
    argv = list(m["argv"])
    embeddings = EMBEDDINGS in argv
    argv = [a for a in argv if a != EMBEDDINGS]
    key = "model-url" if flag_key(argv[0]) == "model_url" else "model"
    return key, argv[2:], embeddings


def preset_ini(doc: dict[str, Any], host: str = "127.0.0.1", port: int = 8080) -> str:
    on_demand = [o["unit"] if o["models"] == [o["unit"]] else f"{o['unit']} ({', '.join(o['models'])})"
                 for o in doc["on_demand"]]
    lines = ["version = 1",
             f"; llama-server --models-preset THIS_FILE --models-max {models_max(doc)} --host {host} --port {port}",
             f"; from a fitplan set plan ({LLAMA_CPP_PIN})",
             f"; resident: {', '.join(m['name'] for m in _resident(doc)) or 'none'}; "
             f"on demand, one unit at a time: {', '.join(on_demand) or 'none'}"]
    if len(doc["on_demand"]) > 1:
        lines.append("; the router unloads its least recently used instance to make room, resident ones included: "
                     "two on-demand units may then be loaded at once, which the plan does not hold; llama-swap's "
                     "configuration (plan-set --format llama-swap) keeps the resident set")
    for m in doc["models"]:
        key, flags, embeddings = _split(m)
        lines += ["", f"[{m['name']}]", f"{key} = {preset_value(key, m['model'])}"]
        lines += [f"{k} = {v}" for k, v in preset_options(flags)]
        if embeddings:
            lines.append("embeddings = true")
        lines.append(f"load-on-startup = {'true' if m['resident'] else 'false'}")
    return "\n".join(lines) + "\n"


def _cmd(program: str, m: dict[str, Any], host: str) -> str:
    for a in m["argv"]:
        if "${" in a:   # llama-swap expands ${...} in cmd as its macros
            raise BadInput(f"--format llama-swap: {m['name']}: the argument {a!r} holds '${{', which llama-swap "
                           "reads as a macro")
    return f"{shlex.join([program, *m['argv'], *arg('host', host)])} {' '.join(arg('port', PORT_MACRO))}"


def _env(doc: dict[str, Any]) -> list[str]:
    inventory = inventory_from_dict(doc["inventory"], "set plan") if doc.get("inventory") else None
    env = environment(Deployment("", None, LlamaFlags(), inventory, {}))
    return [f"{k}={v}" for k, v in env.items()]


def llama_swap_config(doc: dict[str, Any], program: str = "llama-server", host: str = "127.0.0.1") -> str:
    env = _env(doc)
    models: dict[str, Any] = {}
    for m in doc["models"]:
        entry: dict[str, Any] = {"cmd": _cmd(program, m, host), "proxy": f"http://{host}:{PORT_MACRO}"}
        if env:
            entry["env"] = env
        models[m["name"]] = entry
    groups: dict[str, Any] = {}
    resident = [m["name"] for m in _resident(doc)]
    if resident:
        groups[RESIDENT_GROUP] = {"swap": False, "exclusive": False, "persistent": True, "members": resident}
    for o in doc["on_demand"]:
        groups[o["unit"]] = {"swap": False, "exclusive": True, "persistent": False, "members": list(o["models"])}
    config: dict[str, Any] = {"models": models, "groups": groups}
    if resident:
        config["hooks"] = {"on_startup": {"preload": list(resident)}}   # a copy: no YAML alias
    head = f"# llama-swap configuration from a fitplan set plan ({LLAMA_CPP_PIN})\n"
    return head + yaml.safe_dump(config, sort_keys=False, width=10**6)


SET_TARGETS = ("preset", "llama-swap")


def set_export(doc: dict[str, Any], target: str, program: str = "llama-server", host: str = "127.0.0.1",
               port: int = 8080) -> str:
    """`fitplan export SET-PLAN --to preset|llama-swap`."""
    if target == "preset":
        return preset_ini(doc, host, port)
    if target == "llama-swap":
        return llama_swap_config(doc, program, host)
    raise BadInput(f"--to {target!r}: a set plan exports as one of {', '.join(SET_TARGETS)}")
