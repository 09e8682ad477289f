"""``loopscale demo``: the whole study on this machine in one command.

Runs the ``demo`` preset (real training on the embedded King James Bible, on CPU), then ``loopscale analyze`` on
it (whose summary gives phi with its interval and the buildable compute-optimal models), and says where the
tables and plots are and how to open the UI. A second ``loopscale demo`` resumes an interrupted sweep or, when it is complete,
reuses it and only re-runs the analysis (replacing the previous analysis run in MLflow).

``loopscale demo --validate`` ends the sweep with a validation rung per r at ``RUNG_FACTOR`` x its largest budget
(search/validate.py): the law's compute-optimal model trained there and compared with its prediction, which
the analysis then reports. The rungs follow the sweep, so a finished demo run again with ``--validate`` trains
only them. ``loopscale demo --evaluate`` scores the kept models on the built-in probes before the analysis, which
then reports them per axis and r (docs/downstream.md).
"""

from __future__ import annotations

from loopscale.analysis.store import redact

from .spec import SweepSpec

RUNG_FACTOR = 2  # the demo's rung: twice its largest budget, as the paper preset's


def demo_spec(tracking_uri: str | None = None, validate: bool = False) -> SweepSpec:
    """The demo preset, with its rungs when ``validate``."""
    spec = SweepSpec.from_toml("demo", tracking_uri=tracking_uri)
    if not validate:
        return spec
    rung = RUNG_FACTOR * max(spec.grid.budgets)
    return SweepSpec.from_toml("demo", [f"validate.budgets=[{rung:g}]"], tracking_uri=tracking_uri)


def run_demo(tracking_uri: str | None = None, verbose: bool = False, validate: bool = False,
             evaluate: bool = False) -> int:
    """Search (resuming or reusing earlier state), with ``validate`` its rungs, with ``evaluate`` the kept models
    scored on the built-in probes (search/downstream.py), analyse, and point at the results."""
    from loopscale.analysis.cli import analyze_experiment

    from .tune.driver import run_search  # imports Ray: only when the demo really runs

    spec = demo_spec(tracking_uri, validate)
    run_search(spec, resume=True, verbose=verbose)
    if evaluate:
        from . import downstream

        print("\n".join(downstream.render(*downstream.evaluate_tasks(spec.name, downstream.BUILT_IN, [],
                                                                     spec.placement.tracking_uri))))

    out = analyze_experiment(spec.name, spec.placement.tracking_uri)  # its summary ends with the buildable models
    print(f"\ntables: {out / 'tables'}\nplots:  {out / 'plots'}\n"
          f"browse every run and the analysis in the MLflow UI: loopscale ui --experiment {spec.name}"
          + ("" if tracking_uri is None else f" --tracking-uri {redact(spec.placement.tracking_uri)}"))
    return 0
