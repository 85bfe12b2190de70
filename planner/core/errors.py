"""One error hierarchy for the whole tool: the CLI catches `FitplanError` once.

Each subclass carries the facts of its failure; `exit_code` follows DESIGN.md
(1 infeasible, 2 bad input).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class FitplanError(Exception):
    """Base of every error fitplan reports to a user. `code` names the kind in the error document
    (`--format json|yaml`: {"error": {"code", "message", "shortfalls", "suggestions"}}, DESIGN.md)."""

    exit_code = 2
    code = "error"

    def document(self) -> dict[str, Any]:
        """The error as `--format json|yaml` prints it on stdout."""
        return {"error": {"code": self.code, "message": str(self), "shortfalls": [], "suggestions": []}}


class BadInput(FitplanError):
    """The user's input (a file, a flag, a YAML document) is unusable."""

    code = "bad_input"


class UsageError(BadInput):
    """The command line itself is wrong (click's usage errors: an unknown option, a missing argument)."""

    code = "usage"


class GGUFError(BadInput):
    """A model file is not a readable GGUF, or its header is inconsistent or hostile."""

    code = "bad_gguf"

    def __init__(self, path: str, problem: str, offset: int | None = None) -> None:
        self.path = path
        self.problem = problem
        self.offset = offset     # where in the file the offending field starts, when known
        super().__init__(f"{path}: {problem}" + (f" (byte {offset})" if offset is not None else ""))


class ModelShapeError(BadInput, ValueError):
    """A graph cannot be built from the model's tensors: its metadata (head counts, widths) and its
    weights disagree, or a tensor the architecture needs is missing — a file llama.cpp refuses at load
    ("wrong shape" / "missing tensor"). A ValueError too, for the callers that fall back on one."""


class RemoteError(BadInput):
    """A network read failed (HTTP status, connection, TLS, timeout); `status` is the HTTP status
    when the server answered, so a caller can tell "no such file" (404) from the rest."""

    code = "remote"

    def __init__(self, url: str, problem: str, status: int | None = None) -> None:
        self.url = url
        self.problem = problem
        self.status = status
        super().__init__(f"{url}: {problem}")


class FlagError(BadInput):
    """A llama.cpp or sd-cli flag fitplan cannot accept."""

    code = "bad_flag"


class DrafterOutputUnreachable(FlagError):
    """A drafter that runs the target's output matrix is on devices that cannot run it (llama.cpp aborts);
    the planner skips such placements, `estimate` refuses them."""


class InventoryError(BadInput):
    """A device inventory, a device name or a budget string is wrong."""

    code = "bad_inventory"


@dataclass(frozen=True)
class Shortfall:
    device: str
    need_bytes: int
    budget_bytes: int

    @property
    def missing_bytes(self) -> int:
        return max(0, self.need_bytes - self.budget_bytes)


@dataclass(frozen=True)
class Suggestion:
    """One thing that would fit, as found by planning it: a budget for one device (`device`,
    `budget_bytes`), a context (`n_ctx`), a KV cache type; `exact` is False when the search was
    stopped by its time limit and `budget_bytes` is a verified upper bound, not the least."""

    text: str
    device: str | None = None
    budget_bytes: int | None = None
    n_ctx: int | None = None
    cache_type: str | None = None
    exact: bool = True

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"text": self.text}
        for key in ("device", "budget_bytes", "n_ctx", "cache_type"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out["exact"] = self.exact
        return out


class InfeasiblePlacement(FitplanError):
    """No placement fits the budgets; carries each device's shortfall and what would fit."""

    exit_code = 1
    code = "infeasible"

    def __init__(self, message: str, shortfalls: tuple[Shortfall, ...] = (), suggestion: str = "",
                 suggestions: tuple[Suggestion, ...] = ()) -> None:
        self.shortfalls = shortfalls
        self.suggestions = suggestions
        self.suggestion = suggestion or "; ".join(s.text for s in suggestions)
        super().__init__(message)

    def document(self) -> dict[str, Any]:
        doc = super().document()
        doc["error"]["shortfalls"] = [{"device": s.device, "need_bytes": s.need_bytes, "budget_bytes": s.budget_bytes}
                                      for s in self.shortfalls]
        doc["error"]["suggestions"] = ([s.to_dict() for s in self.suggestions] or
                                       ([{"text": self.suggestion}] if self.suggestion else []))
        return doc
