#!/usr/bin/env bash
# Regenerates the committed lock from pyproject.toml (pip-tools: `pip install pip-tools`):
#   requirements/test.txt  the dependencies and the test, docs and examples extras (scripts/test.sh, .ci/run)
#   requirements/run.txt   the dependencies and the examples extra (scripts/install.sh), at test.txt's versions
# Every pin carries the sha256 of each file PyPI has for it, so `pip install --require-hashes` installs exactly
# what was tested. The lock is resolved for Python 3.11 on x86-64 Linux (CI's and the users' here): run it
# with that Python. Extra arguments go to pip-compile: `scripts/lock.sh --upgrade` moves every pin to the
# newest version pyproject.toml allows, `--upgrade-package NAME` one of them.
set -euo pipefail
cd "$(dirname "$0")/.."

# Resolved against PyPI alone: a machine's own pip configuration (local mirrors, find-links, constraints)
# must not decide what everyone installs.
export PIP_CONFIG_FILE=/dev/null
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_INDEX_URL PIP_CONSTRAINT
# the command the header of each file names
export CUSTOM_COMPILE_COMMAND="scripts/lock.sh"
compile=(pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url
         --no-emit-find-links --resolver=backtracking)

"${compile[@]}" --extra test --extra docs --extra examples -o requirements/test.txt "$@" pyproject.toml
# pip-compile keeps an output file's existing pins where they still fit: starting run.txt from test.txt gives
# the two files the same version of every package they share.
cp requirements/test.txt requirements/run.txt
"${compile[@]}" --extra examples -o requirements/run.txt pyproject.toml
