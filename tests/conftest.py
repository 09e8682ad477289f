"""Shared by every test: the suite never logs to a store named by the caller's environment, and test aids are off
unless a test asks for them (the ``testing_aids`` fixture)."""

import pytest

from loopscale.analysis.store import TRACKING_ENV
from loopscale.objectives.testing import TESTING_ENV


@pytest.fixture(autouse=True)
def _no_tracking_uri_from_the_environment(monkeypatch):
    # $MLFLOW_TRACKING_URI outranks the default store (analysis/store.py); tests that rely on the default, or on
    # the variable, must not see the one of the shell that runs them
    monkeypatch.delenv(TRACKING_ENV, raising=False)
    monkeypatch.delenv(TESTING_ENV, raising=False)


@pytest.fixture
def testing_aids(monkeypatch):
    """Specs may carry a [testing] table (objectives/testing.py), here and in the drivers a test starts."""
    monkeypatch.setenv(TESTING_ENV, "1")



def pytest_collection_modifyitems(items):
    """Tests marked ``waits`` run first (all on the first worker: xdist hands each worker a contiguous third of
    the list), their waits beside the other workers' CPU instead of in the last minute with nothing beside them.
    Then modules holding sweeps, servers or a browser (tests marked slow, integration or browser), each
    module's tests kept together and in order: the workers then end on quick tests, which balance their last
    minutes, instead of one worker finishing a two-minute sweep while the others wait."""
    heavy = {item.module.__name__ for item in items
             if any(item.get_closest_marker(m) for m in ("slow", "integration", "browser"))}
    items.sort(key=lambda item: (not item.get_closest_marker("waits"), item.module.__name__ not in heavy))
