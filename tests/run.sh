#!/usr/bin/env bash
# Everything the test suite needs on a fresh machine (Debian, Python 3.11, root), then the suite itself.
# This is the README's test command; .ci/run calls it. `--fast` (first argument) leaves out the tests marked
# slow, integration or browser (real Ray/MLflow sweeps, servers, Chromium), and the system packages only they
# need: the quick lane for an edit. Any other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
lane=()
if [[ "${1:-}" == "--fast" ]]; then
    shift
    lane=(-m "not slow and not integration and not browser")
fi
# Debian's Chromium (browser test) and PostgreSQL (shared MLflow server test), only when missing.
if [[ ${#lane[@]} -eq 0 ]] && { ! command -v chromium >/dev/null || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium postgresql >/dev/null
fi
# The CPU wheel of torch first: an unpinned torch would pull a multi-GB CUDA build on this kind of machine.
python -m pip install --quiet --disable-pip-version-check torch==2.13.0
python -m pip install --quiet --disable-pip-version-check -e ".[test]"
# Three workers on two cores: with two, the cores sit idle while integration tests wait on Ray start-up,
# subprocesses and servers; a third keeps them busy (docs/log.md, 2026-12-06 (17)). Every test keeps to its own
# folders and free ports and starts its own Ray, so they run side by side.
python -m pytest -n 3 --dist worksteal "${lane[@]}" "$@"
