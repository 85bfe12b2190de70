"""The model-set file `fitplan plan-set FILE` reads: several models meant to share one box, each with
its demands (issue #44). One module, one schema; every error names the file and the key.

    fitplan_set: 1                 # optional: the schema's version
    disk_read: 2GiB                # optional: bytes read per second where the models lie (load seconds)
    models:
      chat:                        # the name requests use: router preset section, llama-swap model id
        model: example:gemma3-270m # any model reference fitplan reads
        role: chat                 # chat | code | embedding | other (embedding: llama-server --embeddings)
        ctx: 4096                  # context tokens (default: the training context)
        slots: 1                   # llama-server -np
        cache_type: f16            # KV cache type (-ctk/-ctv)
        resident: always           # always | auto (default: resident when it fits) | on-demand
        group: main                # the models of one group are resident together, or loaded together
        priority: 10               # higher first: the devices' first choice, and resident before others
        draft: drafter.gguf        # optional companions, placed with the model as `fitplan plan --draft`
        mmproj: mmproj.gguf        #   and `--mmproj` place them (llama-server -md, -mm)

The inventory is the command line's, as for `fitplan plan`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from planner.core.errors import BadInput, InventoryError
from planner.core.units import quote
from planner.model.costs import CACHE_TYPES
from planner.search.result import Companions, PlanRequest
from planner.system.files import read_bounded
from planner.system.schema import Where, choice, load_yaml, mapping, size, text

SET_VERSION = 1
# a name is a router preset's section and a llama-swap model id: INI section names end at ']' and
# llama-swap expands `${...}` macros, so names keep to a plain alphabet
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class SetFileError(BadInput):
    """A model-set file that cannot be planned: a wrong key, value or group."""

    code = "bad_set"


class Role(str, Enum):
    CHAT = "chat"
    CODE = "code"
    EMBEDDING = "embedding"
    OTHER = "other"


class Residency(str, Enum):
    ALWAYS = "always"        # must stay loaded: the set is infeasible when it cannot
    AUTO = "auto"            # loaded with the always-on models when it fits beside them, else on demand
    ON_DEMAND = "on-demand"  # loaded when asked for, swapping with the other on-demand models


@dataclass(frozen=True)
class SetEntry:
    name: str
    model: str
    role: Role = Role.CHAT
    n_ctx: int | None = None      # None: the training context
    slots: int = 1
    cache_type: str = "f16"
    resident: Residency = Residency.AUTO
    group: str | None = None
    priority: int = 0
    draft: str | None = None      # a drafter (-md), placed with the model
    mmproj: str | None = None     # a multimodal projector (-mm), placed with the model


@dataclass(frozen=True)
class ModelSet:
    source: str
    entries: tuple[SetEntry, ...]
    disk_read_bytes_s: int | None = None

    def entry(self, name: str) -> SetEntry:
        return next(e for e in self.entries if e.name == name)

    def with_entry(self, name: str, **changes: Any) -> ModelSet:
        """The same set with one model's demands changed (what a suggestion re-plans)."""
        return replace(self, entries=tuple(replace(e, **changes) if e.name == name else e for e in self.entries))


def plan_request(e: SetEntry) -> PlanRequest:
    """What `fitplan plan` is asked for one model. `ctx` is each slot's: llama-server's -c is the slots'
    total (it splits it among them)."""
    return PlanRequest(n_ctx=None if e.n_ctx is None else e.n_ctx * e.slots, n_parallel=e.slots,
                       cache_types=(e.cache_type,), companions=Companions(draft=e.draft, mmproj=e.mmproj))


_TOP = {"fitplan_set": f"the schema version ({SET_VERSION})", "disk_read": "a size read per second, e.g. 2GiB",
        "models": "a mapping from model names to their demands"}
_ENTRY = {"model": "a model reference (a GGUF path, example:NAME, a URL)", "role": "chat, code, embedding or other",
          "ctx": "context tokens", "slots": "llama-server -np slots", "cache_type": "a KV cache type",
          "resident": "always, auto or on-demand", "group": "a group name", "priority": "an integer",
          "draft": "a drafter model reference", "mmproj": "a multimodal projector reference"}


def _positive(value: Any, where: Where, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise where.error(f"expected {what} (a positive whole number); got {quote(value)}")
    return value


def _integer(value: Any, where: Where) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > 10**6:
        raise where.error(f"expected an integer from -1000000 to 1000000; got {quote(value)}")
    return value


def _name(value: Any, where: Where, what: str) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise where.error(f"expected {what}: letters, digits, '.', '_' or '-', at most 64; got {quote(value)}")
    return value


def _entry(name: str, value: Any, where: Where) -> SetEntry:
    doc = mapping(value, where, _ENTRY, required=("model",))
    cache = text(doc.get("cache_type", "f16"), where.key("cache_type"), "a KV cache type").lower()
    if cache not in CACHE_TYPES:
        raise where.key("cache_type").error(f"expected one of {', '.join(CACHE_TYPES)}; got {quote(cache)}")
    return SetEntry(
        name=name, model=text(doc["model"], where.key("model"), "a model reference"),
        role=choice(doc.get("role", "chat"), where.key("role"), {r.value: r for r in Role}),
        n_ctx=None if doc.get("ctx") is None else _positive(doc["ctx"], where.key("ctx"), "context tokens"),
        slots=_positive(doc.get("slots", 1), where.key("slots"), "slots"), cache_type=cache,
        resident=choice(doc.get("resident", "auto"), where.key("resident"), {r.value: r for r in Residency}),
        group=None if doc.get("group") is None else _name(doc["group"], where.key("group"), "a group name"),
        priority=_integer(doc.get("priority", 0), where.key("priority")),
        draft=None if doc.get("draft") is None else text(doc["draft"], where.key("draft"), "a drafter reference"),
        mmproj=None if doc.get("mmproj") is None else text(doc["mmproj"], where.key("mmproj"),
                                                           "a projector reference"))


# the name the exports give the resident set's group (planning/set_exports.py)
RESERVED_GROUP = "fitplan-resident"


def _check_groups(entries: tuple[SetEntry, ...], where: Where) -> None:
    """The members of a group load together: one residency for all of them. A group is a unit named
    as the group, a model on its own one named as the model: the names must not meet."""
    kinds: dict[str, set[Residency]] = {}
    lone = {e.name for e in entries if e.group is None}
    for e in entries:
        if e.group is not None:
            kinds.setdefault(e.group, set()).add(e.resident)
            if e.group in lone or e.group == RESERVED_GROUP:
                raise where.key("models").key(e.name).key("group").error(
                    f"{e.group!r} is the name of a model outside the group, or reserved; expected another name")
    for group, seen in kinds.items():
        if len(seen) > 1:
            listed = ", ".join(sorted(r.value for r in seen))
            raise where.key("models").error(f"group {group!r} mixes resident: {listed}; its models load together, "
                                            "so give them one residency")


def parse_model_set(doc: Any, where: Where) -> ModelSet:
    try:
        top = mapping(doc, where, _TOP, required=("models",))
        if top.get("fitplan_set", SET_VERSION) != SET_VERSION:
            raise where.key("fitplan_set").error(f"expected {SET_VERSION}; got {quote(top['fitplan_set'])}")
        models = top["models"]
        if not isinstance(models, dict) or not models:
            raise where.key("models").error("expected a mapping from model names to their demands, at least one")
        entries = tuple(_entry(_name(k, where.key("models"), "a model name"), v, where.key("models").key(str(k)))
                        for k, v in models.items())
        _check_groups(entries, where)
        disk = None if top.get("disk_read") is None else size(top["disk_read"], where.key("disk_read"))
        if disk == 0:
            raise where.key("disk_read").error("expected a positive size read per second")
    except InventoryError as e:   # the schema helpers' error, under this file's own code
        raise SetFileError(str(e)) from None
    return ModelSet(where.file, entries, disk)


def read_model_set(path: str) -> ModelSet:
    try:
        data = read_bounded(path, what="model-set file")
    except BadInput as e:
        raise SetFileError(str(e)) from None
    try:
        return parse_model_set(load_yaml(data.decode("utf-8"), Where(path)), Where(path))
    except UnicodeDecodeError as e:
        raise SetFileError(f"{path}: not UTF-8 text (byte {e.start}); expected a YAML mapping") from None
    except InventoryError as e:
        raise SetFileError(str(e)) from None
