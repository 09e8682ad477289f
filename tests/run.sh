#!/usr/bin/env bash
# Everything the test suite needs on a fresh machine (Debian, Python 3.11, root), then the suite itself.
# This is the README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian's Chromium (browser test) and PostgreSQL (shared MLflow server test), only when missing.
if ! command -v chromium >/dev/null || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium postgresql >/dev/null
fi
# The CPU wheel of torch first: an unpinned torch would pull a multi-GB CUDA build on this kind of machine.
python -m pip install --quiet --disable-pip-version-check torch==2.13.0
python -m pip install --quiet --disable-pip-version-check -e ".[test]"
# Two workers: run one at a time, the suite left ~30% of 2 cores idle (load ~1.4), its integration tests waiting
# on Ray start-up, subprocesses and servers; on 2 workers it took 18 min instead of 27 (2026-12-02, 2 cores).
# Every test keeps to its own folders and free ports and starts its own Ray, so they run side by side.
python -m pytest -n 2 --dist worksteal "$@"
