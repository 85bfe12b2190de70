"""Where `example:NAME` is assembled: fitplan's cache as the environment names it at the time of the call."""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.registry import examples


def test_examples_follow_xdg_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FITPLAN_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert examples.models_dir() == tmp_path / "xdg" / "fitplan" / "models"
    path = Path(examples.resolve_model("example:gemma3-270m"))
    assert path.parent == tmp_path / "xdg" / "fitplan" / "models"
    assert path.stat().st_size > 100 * 2**20   # the real 270M weights, assembled from the package


def test_fitplan_cache_wins_over_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("FITPLAN_CACHE", str(tmp_path / "own"))
    assert examples.models_dir() == tmp_path / "own" / "models"
