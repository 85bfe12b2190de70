#!/usr/bin/env bash
# The tests against the newest versions pyproject.toml allows, not the lock's: a new virtual environment,
# `pip install --upgrade -e '.[test,docs,examples]'`, then pytest (arguments passed through), and a short
# report: each package whose version differs from requirements/test.txt, and pytest's summary line.
# Not part of .ci/run; run it before moving the lock (scripts/lock.sh --upgrade).
#   scripts/test_newest.sh tests/bench tests/planner/core
# The environment is made in a temporary directory and removed after ($FITPLAN_NEWEST_VENV keeps it there).
set -uo pipefail
cd "$(dirname "$0")/.."

venv="${FITPLAN_NEWEST_VENV:-}"
if [ -z "$venv" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  venv="$tmp/venv"
fi
log="$(mktemp)"

scripts/test_deps.sh || exit 1
python -m venv "$venv" || exit 1
"$venv/bin/python" -m pip install -q --upgrade -e '.[test,docs,examples]' || { echo "test_newest: install failed" >&2; exit 1; }

moved="$("$venv/bin/python" - <<'PY'
import re
from importlib.metadata import distributions

from packaging.utils import canonicalize_name

locked = {}
for line in open("requirements/test.txt"):
    pin = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
    if pin:
        locked[canonicalize_name(pin.group(1))] = pin.group(2)
now = {canonicalize_name(d.metadata["Name"]): d.version for d in distributions()}
for name in sorted(set(locked) | set(now)):
    if name in ("fitplan", "pip", "setuptools", "wheel"):
        continue
    was, got = locked.get(name, "-"), now.get(name, "-")
    if was != got:
        print(f"  {name} {was} -> {got}")
PY
)"

"$venv/bin/python" -m pytest "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
summary="$(grep -E '(passed|failed|errors?|skipped|no tests ran).* in [0-9.]+s' "$log" | tail -n 1 | tr -d '=' \
  | sed 's/^ *//; s/ *$//')"
rm -f "$log"

echo
echo "test_newest: versions that differ from requirements/test.txt (locked -> newest allowed):"
echo "${moved:-  none}"
echo "test_newest: pytest ${*:-(all tests)}: ${summary:-no summary line} (exit $rc)"
exit "$rc"
