"""Progress lines and the ETA, across a resume (Tune pickles the progress with the sweep and unpickles it)."""

from __future__ import annotations

import pickle

from loopscale.search.progress import Progress

OK = {"status": "ok", "val_loss": 2.0, "width": 32}


def test_lines_count_every_trial_and_keep_the_best_per_cell():
    progress = Progress("search", {"C=1e+12,r=1": 2, "C=1e+12,r=2": 1})
    first = progress.record("C=1e+12,r=1", OK, 4.0)
    assert first.startswith("[search 1/3] C=1e+12,r=1") and "s=4 val_loss 2.0000" in first
    assert "best 1.5000 at s=2" in progress.record("C=1e+12,r=1", {**OK, "val_loss": 1.5}, 2.0)
    assert "failed" in progress.record("C=1e+12,r=2", None, 3.0) and progress.done == progress.planned
    assert progress.eta() == "0:00:00"
    table = progress.table()
    assert "C=1e+12,r=1" in table and "1.5000" in table and "search: 3/3 trials" in table


def test_a_resumed_progress_counts_restored_trials_and_restarts_its_clock():
    progress = Progress("search", {"C=1e+12,r=1": 4})
    progress.started -= 3600  # the first session began an hour ago
    resumed = pickle.loads(pickle.dumps(progress))
    resumed.restore("C=1e+12,r=1", OK, 2.0)  # finished before the crash: counted, not timed
    assert resumed.eta() == "?" and resumed.done == 1
    line = resumed.record("C=1e+12,r=1", OK, 3.0)
    assert line.startswith("[search 2/4]")
    # two trials left at this session's pace (a trial took moments), not at the first session's hour per trial
    hours, minutes, _ = (int(part) for part in line.rsplit("ETA ", 1)[1].split(":"))
    assert hours == 0 and minutes < 10, line


def test_cells_the_sampler_finished_early_leave_the_plan_and_the_eta_becomes_a_bound():
    progress = Progress("search", {"C=1e+12,r=1": 5, "C=1e+12,r=2": 5})
    for s in (2.0, 3.0, 4.0):
        line = progress.record("C=1e+12,r=1", OK, s)
    assert " ".join(line.split()).startswith("[search 3/10]") and "ETA <=" not in line
    progress.finish({"C=1e+12,r=1"})  # located after 3 of its 5
    line = progress.record("C=1e+12,r=2", OK, 2.0)
    assert line.startswith("[search 4/8]") and "ETA <= " in line  # r=2 may still stop before its cap
    assert "search: 4/8 trials" in progress.table() and " 3/3 " in progress.table()
    progress.finish({"C=1e+12,r=2"})
    assert progress.planned == progress.done == 4 and progress.eta() == "0:00:00"
