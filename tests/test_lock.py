"""The committed lock (requirements/*.txt, scripts/lock.sh) against pyproject.toml: every requirement is pinned
at a version its range allows, with hashes, and the two files agree; a range edited without relocking fails here."""
from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def pins(path: Path) -> dict[str, tuple[str, int]]:
    """Each locked package's version and how many hashes follow it (continuation lines up to the next pin)."""
    found: dict[str, tuple[str, int]] = {}
    name = ""
    for line in path.read_text().splitlines():
        pin = PIN.match(line)
        if pin:
            name = canonicalize_name(pin.group(1))
            found[name] = (pin.group(2), 0)
        elif line.strip().startswith("--hash=sha256:") and name:
            version, hashes = found[name]
            found[name] = (version, hashes + 1)
    return found


def requirements(*extras: str) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = [*project["dependencies"], *(r for e in extras for r in project["optional-dependencies"][e])]
    return [Requirement(r) for r in listed]


def test_the_lock_pins_every_requirement_within_its_range_with_hashes():
    for lock, extras in (("test.txt", ("test", "docs", "examples")), ("run.txt", ("examples",))):
        locked = pins(ROOT / "requirements" / lock)
        assert locked, lock
        for req in requirements(*extras):
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            name = canonicalize_name(req.name)
            assert name in locked, f"{req} is not in requirements/{lock}: run scripts/lock.sh"
            version, _ = locked[name]
            assert req.specifier.contains(version, prereleases=True), \
                f"requirements/{lock} pins {name}=={version}, outside {req}: run scripts/lock.sh"
        assert all(hashes > 0 for _, hashes in locked.values()), f"a pin without a hash in requirements/{lock}"


def test_run_and_test_locks_agree_on_every_package_they_share():
    run, test = pins(ROOT / "requirements" / "run.txt"), pins(ROOT / "requirements" / "test.txt")
    assert set(run) <= set(test)
    assert {name: run[name][0] for name in run} == {name: test[name][0] for name in run}
