"""Shared by every test: the suite never logs to a store named by the caller's environment."""

import pytest

from loopscale.analysis.store import TRACKING_ENV


@pytest.fixture(autouse=True)
def _no_tracking_uri_from_the_environment(monkeypatch):
    # $MLFLOW_TRACKING_URI outranks the default store (analysis/store.py); tests that rely on the default, or on
    # the variable, must not see the one of the shell that runs them
    monkeypatch.delenv(TRACKING_ENV, raising=False)
