#!/usr/bin/env bash
# The README's test command: the Debian packages the tests use (scripts/test_deps.sh), the locked test
# environment and fitplan (scripts/install.sh --test), then pytest; arguments go to pytest
# (`scripts/test.sh tests/cli -x`). .ci/run runs it after its static checks.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test_deps.sh
scripts/install.sh --test
exec python -m pytest "$@"
