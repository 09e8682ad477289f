"""Shared by every test: the suite never logs to a store named by the caller's environment, and test aids are off
unless a test asks for them (the ``testing_aids`` fixture)."""

from collections import Counter

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
    """Modules holding sweeps, servers or a browser (tests marked slow, integration or browser) run first, those
    with the most tests marked slow first of all, each module's tests kept together and in order: the workers
    (tests/run.sh hands each a whole module) start on the longest modules and end on quick ones, which balance
    their last minutes, instead of one worker finishing a module of killed and resumed sweeps alone while the
    others wait."""
    heavy, slow = set(), Counter()
    for item in items:
        if any(item.get_closest_marker(m) for m in ("slow", "integration", "browser")):
            heavy.add(item.module.__name__)
        slow[item.module.__name__] += item.get_closest_marker("slow") is not None
    items.sort(key=lambda item: (item.module.__name__ not in heavy, -slow[item.module.__name__]))
