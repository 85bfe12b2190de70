"""A set plan's exports checked against the formats their readers define.

llama-swap (github.com/mostlygeek/llama-swap at 0bdb3720, config.example.yaml and internal/config,
internal/router): the rules below are written from its source, and the configuration fitplan writes is
parsed with them; the group semantics (internal/router/group.go EvictionFor) are replayed to show that
loading an on-demand model unloads only the other on-demand units and never a resident model.

The router preset: parsed with the grammar of the pinned common/preset.cpp (parse_ini_from_file); the
pinned llama-server reads it back in tests/peer/test_model_set_peer.py.
"""
from __future__ import annotations

import re
import shlex
from urllib.parse import urlparse

import pytest
import yaml

from planner.cli import main
from planner.emit.set_exports import llama_swap_config, models_max, preset_ini
from planner.llama.flags import parse_llama_flags, takes_value
from tests.support.model_sets import set_files

# --- llama-swap's configuration rules ----------------------------------------------------------------
# internal/config/config.go Config: the top-level keys it reads
SWAP_TOP = {"healthCheckTimeout", "logRequests", "logLevel", "logTimeFormat", "logToStdout", "metricsMaxInMemory",
            "captureBuffer", "store", "ui", "performance", "globalTTL", "unloadTimeout", "models", "profiles",
            "selectors", "routing", "groups", "matrix", "macros", "startPort", "hooks", "sendLoadingState",
            "includeAliasesInList", "apiKeys", "peers", "upstream"}
# internal/config/model_config.go ModelConfig
SWAP_MODEL = {"cmd", "cmdStop", "proxy", "aliases", "env", "checkEndpoint", "ttl", "unloadTimeout", "unlisted",
              "useModelName", "name", "description", "concurrencyLimit", "filters", "macros", "metadata",
              "sendLoadingState", "timeouts", "compat", "capabilities"}
# config.go GroupConfig: swap and exclusive default true, persistent false; members required
SWAP_GROUP = {"swap", "exclusive", "persistent", "members"}
# macros it expands itself: ${PORT} (assigned per model from startPort), ${MODEL_ID}, ${PID} (cmdStop only),
# ${env.NAME}; any other ${...} must be defined under `macros`
SWAP_MACRO = re.compile(r"\$\{([^}]*)\}")
BUILTIN_MACROS = {"PORT", "MODEL_ID"}
ENV_ITEM = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def check_llama_swap(config: dict) -> None:
    """llama-swap's load-time rules (internal/config/load.go) on a parsed configuration."""
    assert set(config) <= SWAP_TOP, set(config) - SWAP_TOP
    assert not ("groups" in config and "routing" in config)   # legacy top-level groups XOR routing.router
    models = config["models"]
    assert isinstance(models, dict) and models
    for mid, m in models.items():
        assert set(m) <= SWAP_MODEL, (mid, set(m) - SWAP_MODEL)
        assert isinstance(m["cmd"], str) and m["cmd"].strip()          # cmd is required
        for name in SWAP_MACRO.findall(m["cmd"]) + SWAP_MACRO.findall(m.get("proxy", "")):
            assert name in BUILTIN_MACROS or name.startswith("env.") or name in config.get("macros", {}), name
        # ${PORT} in cmd: the proxy defaults to http://localhost:${PORT}; one given must be a URL on that port
        if "proxy" in m:
            url = urlparse(m["proxy"].replace("${PORT}", "5800"))
            assert url.scheme in ("http", "https") and url.hostname
            assert "${PORT}" not in m["proxy"] or "${PORT}" in m["cmd"]
        # SanitizeCommand: comment lines dropped, then a POSIX shell split
        lines = [line for line in m["cmd"].split("\n") if not line.strip().startswith("#")]
        assert shlex.split("\n".join(lines))
        for item in m.get("env", []):
            assert isinstance(item, str) and ENV_ITEM.match(item), item
    owner: dict[str, str] = {}
    for gid, g in config.get("groups", {}).items():
        assert set(g) <= SWAP_GROUP and "members" in g, gid
        assert all(isinstance(g[k], bool) for k in ("swap", "exclusive", "persistent") if k in g)
        assert len(set(g["members"])) == len(g["members"])               # "duplicate model member"
        for member in g["members"]:
            assert member in models, member                             # members are model ids
            assert member not in owner, (member, owner.get(member), gid)  # "used in multiple groups"
            owner[member] = gid
    for mid in config.get("hooks", {}).get("on_startup", {}).get("preload", []):
        assert mid in models


def _group_of(config: dict) -> dict[str, str]:
    """load.go AddDefaultGroupToConfig: a model in no group joins the default group (swap, exclusive)."""
    out = {m: gid for gid, g in config.get("groups", {}).items() for m in g["members"]}
    return {m: out.get(m, "(default)") for m in config["models"]}


def evicted(config: dict, target: str, running: list[str]) -> list[str]:
    """internal/router/group.go EvictionFor: same-group members go when the group swaps; other groups'
    members go when the target's group is exclusive, unless their group is persistent."""
    groups = {**config.get("groups", {}), "(default)": {"swap": True, "exclusive": True, "persistent": False}}
    group_of = _group_of(config)
    tg = groups[group_of[target]]
    out = []
    for m in running:
        if m == target:
            continue
        og = group_of[m]
        same_group_swaps = og == group_of[target] and tg.get("swap", True)
        exclusive_over = og != group_of[target] and tg.get("exclusive", True) and not groups[og].get("persistent")
        if same_group_swaps or exclusive_over:
            out.append(m)
    return out


# --- the router preset's grammar (common/preset.cpp parse_ini_from_file) ------------------------------
_IDENT = r"[a-zA-Z_][a-zA-Z0-9_.-]*"
_HEADER = re.compile(r"^\[[ \t]*([^]]*?)[ \t]*\][ \t]*(?:[;#].*)?$")
_KV = re.compile(rf"^({_IDENT})[ \t]*=[ \t]*(.*?)[ \t]*(?:[;#].*)?$")
_SKIP = re.compile(r"^[ \t]*(?:[;#].*)?$")
PRESET_ONLY = {"load-on-startup", "stop-timeout", "dedup-cache-models"}   # common_params_add_preset_options


def parse_preset(text: str) -> dict[str, dict[str, str]]:
    sections: dict[str, dict[str, str]] = {}
    current = ""
    for line in text.splitlines():
        if _SKIP.match(line):
            continue
        if header := _HEADER.match(line):
            current = header.group(1)
            sections[current] = {}
        else:
            kv = _KV.match(line)
            assert kv, f"not a line the pinned preset parser reads: {line!r}"
            sections.setdefault(current, {})[kv.group(1)] = kv.group(2)
    return sections


# --- the set --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def doc(tmp_path_factory) -> dict:
    """A set plan on three rpc-servers (none running: planning only reads their sizes): two resident
    models, and two on-demand units, one of them a group of two."""
    d = tmp_path_factory.mktemp("set-exports")
    made = set_files(d)
    small = made.small
    path = d / "set.yaml"
    path.write_text(yaml.safe_dump({"disk_read": "1GiB", "models": {
        **made.resident(),
        "coder": {"model": small, "ctx": 1024, "resident": "on-demand"},
        "pair-a": {"model": small, "ctx": 1024, "resident": "on-demand", "group": "pair"},
        "pair-b": {"model": small, "ctx": 1024, "resident": "on-demand", "group": "pair"}}}))
    out = d / "plan.json"
    devices = [a for i in range(3) for a in ("--device", f"RPC{i}=1GiB@127.0.0.1:{50200 + i}")]
    assert main(["plan-set", str(path), *devices, "--ram", "4GiB", "-o", str(out), "--format", "json"]) == 0
    import json

    return json.loads(out.read_text())


def test_llama_swap_config_follows_its_rules(doc):
    config = yaml.safe_load(llama_swap_config(doc, "/opt/llama/llama-server"))
    check_llama_swap(config)
    assert set(config["models"]) == {m["name"] for m in doc["models"]}
    for m in doc["models"]:
        argv = shlex.split(config["models"][m["name"]]["cmd"].replace("${PORT}", "5800"))
        assert argv[0] == "/opt/llama/llama-server"
        i = argv.index("--host")
        assert argv[i:] == ["--host", "127.0.0.1", "--port", "5800"] and argv[1:i] == m["argv"]


def test_llama_swap_groups_keep_the_resident_set(doc):
    config = yaml.safe_load(llama_swap_config(doc))
    resident = [m["name"] for m in doc["models"] if m["resident"]]
    assert config["hooks"]["on_startup"]["preload"] == resident
    # each on-demand unit evicts the other units' running models, never a resident one
    for o in doc["on_demand"]:
        others = [m for u in doc["on_demand"] if u is not o for m in u["models"]]
        for target in o["models"]:
            mates = [m for m in o["models"] if m != target]
            assert evicted(config, target, resident + mates + others) == others
            assert sorted(o["evicts"]) == sorted(u["unit"] for u in doc["on_demand"] if u is not o)
    # a resident model, loaded again after an unload, unloads nothing
    for name in resident:
        assert evicted(config, name, [m["name"] for m in doc["models"]]) == []


def test_preset_parses_and_holds_each_plan(doc):
    sections = parse_preset(preset_ini(doc))
    assert sections.pop("") == {"version": "1"}
    assert list(sections) == [m["name"] for m in doc["models"]]
    for m in doc["models"]:
        s = sections[m["name"]]
        assert s.pop("model") == m["model"]
        assert s.pop("load-on-startup") == ("true" if m["resident"] else "false")
        assert (s.pop("embeddings", None) == "true") == (m["role"] == "embedding")
        argv = []
        for key, value in s.items():
            flag = next(f for f in (f"-{key}", f"--{key}") if takes_value(f) is not None)
            argv += [flag] if value == "true" and not takes_value(flag) else [flag, value]
        assert parse_llama_flags(argv) == parse_llama_flags([a for a in m["argv"][2:] if a != "--embeddings"])


def test_models_max_holds_the_resident_set_and_the_largest_unit(doc):
    assert models_max(doc) == 2 + 2
    assert "--models-max 4" in preset_ini(doc).splitlines()[1]
