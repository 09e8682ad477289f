"""Trial checkpoints without Ray: a training trial stopped right after a checkpoint and started again from it
ends exactly as the trial that never stopped (objectives/checkpoint.py), warmdown branches included."""

from __future__ import annotations

import pytest

from loopscale.objectives import train
from loopscale.objectives.checkpoint import (SEAL_FILE, SET_ASIDE, STATE_FILE, Checkpointing, DamagedCheckpoint,
                                             load_state, restore_or_set_aside, save_state)
from loopscale.objectives.recipe import normalize_recipe, warmdown_start
from test_train import cache_dir, trial  # noqa: F401 (fixture)
from test_warmdown import WSD


class Killed(Exception):
    """Stands for the kill: raised by the checkpoint hook right after its ``kill_after``-th save."""


def folder_checkpoints(folder, kill_after=None, owner="trial-a"):
    """A ``Checkpointing`` that saves every step into ``folder`` (the state of the last save kept) and raises
    ``Killed`` after the ``kill_after``-th save; the steps it saved at."""
    saved_steps = []

    def save(state):
        save_state(state, folder, owner)
        saved_steps.append(state["loop"]["step"])
        if len(saved_steps) == kill_after:
            raise Killed

    return Checkpointing(period_s=1e-9, save=save, restore=lambda: restore_or_set_aside(folder, owner)), saved_steps


def interrupted(config, folder, kill_after):
    """Train ``config`` until the ``kill_after``-th checkpoint, then again from it: (result, every report of
    both attempts, the step it resumed from)."""
    reports = []
    hook, steps = folder_checkpoints(folder, kill_after)
    with pytest.raises(Killed):
        train(config, report=reports.append, checkpoint=hook)
    resumed, _ = folder_checkpoints(folder)
    return train(config, report=reports.append, checkpoint=resumed), reports, steps[-1]


def curve(reports):
    """{step: train_loss} of the reports."""
    return {r["step"]: r["train_loss"] for r in reports}


@pytest.fixture(scope="module")
def uninterrupted(cache_dir):
    """A ~46-step trial (reports every 10 steps) trained without a stop: (its config, result, reports)."""
    config = trial(cache_dir, 2, 2, 2e11)
    reports = []
    return config, train(config, report=reports.append), reports


@pytest.mark.parametrize("kill_after", [3, 17])
def test_a_resumed_trial_ends_exactly_as_the_uninterrupted_one(uninterrupted, tmp_path, kill_after):
    config, whole, whole_reports = uninterrupted
    result, reports, step = interrupted(config, tmp_path, kill_after)
    assert step == kill_after and result["resumed_from_step"] == kill_after and result["resumes"] == 1
    assert result["val_loss"] == whole["val_loss"]  # bit for bit on a CPU
    assert result["train_loss"] == whole["train_loss"]
    assert (result["tokens"], result["steps"], result["flops_spent"]) == (whole["tokens"], whole["steps"],
                                                                            whole["flops_spent"])
    resumed_reports = [r for r in reports if "resumed_from_step" in r]
    assert [r["step"] for r in resumed_reports] == [r["step"] for r in whole_reports]  # the whole curve again
    assert curve(resumed_reports) == curve(whole_reports)


def test_a_branched_trial_killed_between_its_branch_points_resumes_exactly(cache_dir, tmp_path):
    config = trial(cache_dir, 2, 2, 1e11, {**WSD, "branch_budgets": [3e10, 6e10]})
    whole = train(config)
    forks = [warmdown_start(normalize_recipe(WSD), whole[f"branch{i}.steps"]) for i in range(2)]
    kill_after = forks[0] + 2  # past branch 0's fork, before branch 1's
    assert forks[0] < kill_after < forks[1]
    result, _, step = interrupted(config, tmp_path, kill_after)
    assert step == kill_after
    branches = {k: v for k, v in result.items() if k.startswith("branch")}
    assert branches == {k: v for k, v in whole.items() if k.startswith("branch")}
    assert result["val_loss"] == whole["val_loss"] and result["flops_spent"] == whole["flops_spent"]


def test_checkpoint_period_is_checked():
    with pytest.raises(ValueError, match="checkpoint period must be >= 0"):
        Checkpointing(period_s=-1, save=print, restore=lambda: None)


def cut_in_half(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def other_owner(folder):
    save_state(load_state(folder, "trial-a"), folder, "trial-b")


class Code:
    """Not plain data: unpickling it runs this module's code."""


def foreign_object(folder):
    save_state({"loop": {"step": 1}, "payload": Code()}, folder, "trial-a")


@pytest.mark.parametrize("damage, why", [(cut_in_half, "does not match its checksum"),
                                         (other_owner, "belongs to another trial"),
                                         (foreign_object, "does not load: UnpicklingError")])
def test_a_damaged_checkpoint_is_set_aside_and_the_trial_trains_from_step_0(uninterrupted, tmp_path, capfd, damage,
                                                                          why):
    config, whole, _ = uninterrupted
    hook, _ = folder_checkpoints(tmp_path, kill_after=5)
    with pytest.raises(Killed):
        train(config, checkpoint=hook)
    damage(tmp_path / STATE_FILE if damage is cut_in_half else tmp_path)
    with pytest.raises(DamagedCheckpoint, match=why):
        load_state(tmp_path, "trial-a")

    resumed, _ = folder_checkpoints(tmp_path)
    result = train(config, checkpoint=resumed)
    assert "resumed_from_step" not in result and result["val_loss"] == whole["val_loss"]  # from step 0, bit for bit
    assert f"checkpoint set aside: {tmp_path / STATE_FILE}" in capfd.readouterr().err
    kept = sorted(p.name.split(SET_ASIDE)[0] for p in tmp_path.iterdir() if SET_ASIDE in p.name)
    assert kept == sorted([SEAL_FILE, STATE_FILE])  # moved out of the way, kept for a look


def test_a_state_without_its_seal_is_not_loaded(tmp_path):
    save_state({"loop": {"step": 3}}, tmp_path, "trial-a")
    assert load_state(tmp_path, "trial-a") == {"loop": {"step": 3}}
    (tmp_path / SEAL_FILE).unlink()
    with pytest.raises(DamagedCheckpoint, match="no readable seal"):
        load_state(tmp_path, "trial-a")
    assert load_state(tmp_path / "none", "trial-a") is None  # no state at all: nothing to resume, no error
