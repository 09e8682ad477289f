"""The Ray a sweep starts on this machine (``search/tune/cluster.py``) is started with ``LOCAL_RAY_ENV``: the
settings are in the environment while it starts, each one the user set keeps the user's value, the environment
is put back afterwards, and a sweep that joins a cluster sets none. (What the settings save is measured in
docs/log.md: a Ray started with Ray's defaults ran two idle workers beside a sweep's trials.)"""

from __future__ import annotations

import os

from loopscale.search.tune.cluster import LOCAL_RAY_ENV, _local_ray_env

PRESTART = "RAY_prestart_worker_first_driver"


def test_a_local_ray_gets_its_settings_a_user_s_own_win_and_a_joined_cluster_gets_none(monkeypatch):
    for name in LOCAL_RAY_ENV:
        monkeypatch.delenv(name, raising=False)
    with _local_ray_env(local=True):
        assert {name: os.environ.get(name) for name in LOCAL_RAY_ENV} == LOCAL_RAY_ENV
        assert os.environ[PRESTART] == "0"  # no worker started ahead of the trials' own
    assert not set(LOCAL_RAY_ENV) & set(os.environ)  # put back
    monkeypatch.setenv(PRESTART, "1")
    with _local_ray_env(local=True):
        assert os.environ[PRESTART] == "1"
        assert all(os.environ[name] == value for name, value in LOCAL_RAY_ENV.items() if name != PRESTART)
    assert set(LOCAL_RAY_ENV) & set(os.environ) == {PRESTART} and os.environ[PRESTART] == "1"
    monkeypatch.delenv(PRESTART)
    with _local_ray_env(local=False):
        assert not set(LOCAL_RAY_ENV) & set(os.environ)
