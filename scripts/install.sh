#!/usr/bin/env bash
# Installs fitplan into the current Python environment from the committed lock: every dependency at the
# version tested, each file checked against its sha256 (pip --require-hashes), then fitplan itself, editable.
#   scripts/install.sh          requirements/run.txt: what `fitplan` needs, and the bundled example model
#   scripts/install.sh --test   requirements/test.txt: that, the test tools and the docs site's (scripts/test.sh)
# The lock is resolved for Python 3.11 on x86-64 Linux; scripts/lock.sh regenerates it.
set -euo pipefail
cd "$(dirname "$0")/.."

lock=requirements/run.txt
case "${1:-}" in
  "") ;;
  --test) lock=requirements/test.txt ;;
  *) echo "install.sh: unknown argument '$1' (use --test or nothing)" >&2; exit 2 ;;
esac

python - <<'PY' || echo "install.sh: warning: the lock was resolved for Python 3.11 on x86-64 Linux" >&2
import platform, sys
sys.exit(0 if sys.version_info[:2] == (3, 11) and platform.machine() == "x86_64" else 1)
PY
python -m pip install --require-hashes -r "$lock"
python -m pip install --no-deps -e .
# pyenv's shims learn of a new console script (fitplan) only on a rehash
if command -v pyenv >/dev/null; then pyenv rehash; fi
