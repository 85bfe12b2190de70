"""One error hierarchy for the whole tool: the CLI catches `FitplanError` once.

Each subclass carries the facts of its failure; `exit_code` follows DESIGN.md
(1 infeasible, 2 bad input).
"""
from __future__ import annotations

from dataclasses import dataclass


class FitplanError(Exception):
    """Base of every error fitplan reports to a user."""

    exit_code = 2


class BadInput(FitplanError):
    """The user's input (a file, a flag, a YAML document) is unusable."""


class GGUFError(BadInput):
    """A model file is not a readable GGUF, or its header is inconsistent or hostile."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


class RemoteError(BadInput):
    """A network read failed (HTTP status, connection, TLS, timeout); `status` is the HTTP status
    when the server answered, so a caller can tell "no such file" (404) from the rest."""

    def __init__(self, url: str, problem: str, status: int | None = None) -> None:
        self.url = url
        self.problem = problem
        self.status = status
        super().__init__(f"{url}: {problem}")


class FlagError(BadInput):
    """A llama.cpp or sd-cli flag fitplan cannot accept."""


class InventoryError(BadInput):
    """A device inventory, a device name or a budget string is wrong."""


@dataclass(frozen=True)
class Shortfall:
    device: str
    need_bytes: int
    budget_bytes: int

    @property
    def missing_bytes(self) -> int:
        return max(0, self.need_bytes - self.budget_bytes)


class InfeasiblePlacement(FitplanError):
    """No placement fits the budgets; carries each device's shortfall and what would fit."""

    exit_code = 1

    def __init__(self, message: str, shortfalls: tuple[Shortfall, ...] = (), suggestion: str = "") -> None:
        self.shortfalls = shortfalls
        self.suggestion = suggestion
        super().__init__(message)
