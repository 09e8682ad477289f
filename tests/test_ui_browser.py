"""The user's day in a real browser: `loopscale ui` on a store filled by a small real sweep and its analysis,
driven by Playwright in Debian's headless Chromium (no browser download). Screenshots land in
test-artifacts/ui/ for a person to look at."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from loopscale.analysis.store import trial_numbers

from tests.servers import free_port

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "ui"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]


def loopscale(*args: str, cwd: Path, timeout: int = 600) -> str:
    done = subprocess.run([sys.executable, "-m", "loopscale.search.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The smoke preset (simulated cells + one real training trial) and its analysis, in a fresh sqlite store."""
    root = tmp_path_factory.mktemp("ui")
    uri = f"sqlite:///{root}/mlflow.db"
    loopscale("search", "smoke", "--tracking-uri", uri, cwd=root)
    loopscale("analyze", "--experiment", "smoke", "--tracking-uri", uri, cwd=root)
    return root, uri


@pytest.fixture
def ui(store):
    """`loopscale ui` as a user starts it; yields the URL it prints, then stops it like Ctrl-C would."""
    root, uri = store
    proc = subprocess.Popen([sys.executable, "-m", "loopscale.search.cli", "ui", "--experiment", "smoke", "--tracking-uri", uri,
                             "--port", str(free_port())], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        match = re.search(r"MLflow UI: (http://127\.0\.0\.1:\d+/\S+)", line)
        assert match, f"no URL printed: {line!r} {proc.stderr.read() if proc.poll() is not None else ''}"
        yield match.group(1), uri
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert "MLflow UI stopped." in proc.stdout.read()


@pytest.fixture
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        # big enough that the runs grid (virtualised: it renders only visible rows and columns) shows every run
        # and every column of the sweep's view at once
        yield browser.new_page(viewport={"width": 2400, "height": 2400})
        browser.close()


def test_runs_table_lists_every_trial_and_the_analysis_plots_render(ui, page):
    url, uri = ui
    SHOTS.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("smoke")
    trials = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'trial'", max_results=1000)
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    # the law sampler stops a cell once its optimum is bracketed: how many simulated trials ran is the store's
    assert sum(run.data.tags.get("objective") == "train" for run in trials) == 1  # the real calibration trial
    assert len(trials) >= 13 and len(runs) == len(trials) + 2  # + the sweep's run + the analysis run

    page.goto(url)
    page.wait_for_selector("text=analysis", timeout=90_000)
    page.get_by_text(f"{len(runs)} matching runs").wait_for(timeout=60_000)
    for run in trials:
        page.get_by_text(run.info.run_name, exact=True).first.wait_for(timeout=30_000)
    page.screenshot(path=str(SHOTS / "runs.png"), full_page=True)
    body = page.inner_text("body")
    for run in trials:
        # every trial is listed by name, and the name carries its r and width
        assert run.info.run_name in body
        assert f"r={run.data.tags['r']} d={int(trial_numbers(run)['width'])}" in run.info.run_name
        if run.data.tags["stage"] == "calibrate":  # calibration runs differ by the rate they try
            assert run.info.run_name.endswith(f" base_lr={float(run.data.params['recipe.base_lr']):.3g}")

    page.get_by_role("link", name="analysis", exact=True).click()
    page.get_by_text("Artifacts").first.click()
    page.get_by_text("plots", exact=True).click()
    page.get_by_text("isoflop.png").click()
    page.get_by_text("plots/isoflop.png", exact=True).wait_for(timeout=60_000)  # the preview pane's title
    image = page.locator("img[src^='blob:']").first  # the UI fetches the artifact and shows it as a blob
    image.wait_for(timeout=60_000)
    page.wait_for_function("img => img.complete && img.naturalWidth > 300 && img.naturalHeight > 200",
                           arg=image.element_handle(), timeout=60_000)
    page.screenshot(path=str(SHOTS / "analysis_isoflop.png"), full_page=True)


def test_the_sweep_opens_in_its_view_by_cell_sorted_by_loss(ui, page):
    """The URL `loopscale ui` prints opens the sweep's shared view in MLflow's training view (the sidebar's runs
    and model registry, no evaluation runs; the experiment's kind is training): r, budget C, width, N, tokens and
    the loss as columns in that order, written for reading (e-notation, k/M counts, 3 decimals), runs grouped by
    cell with no per-column aggregate on a group's row, each group best first and the groups by their best loss.
    A trial's metric charts are its train_loss curve, first, and its val_loss: no chart of a single-valued number
    (N, budget_flops, ...), which buried the curve under 16 one-point charts."""
    url, uri = ui
    assert "viewStateShareKey=loopscale" in url
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("smoke")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    page.goto(url)
    page.locator(".ag-header-cell[col-id='tags.`loss`']").wait_for(timeout=90_000)
    page.get_by_text(f"{len(runs)} matching runs").wait_for(timeout=60_000)
    page.get_by_text("Group: C=1e+13,r=4").wait_for(timeout=30_000)
    page.screenshot(path=str(SHOTS / "runs_view.png"), full_page=True)
    links = page.eval_on_selector_all("nav a", "els => els.map(e => e.innerText.trim())")
    assert "Runs" in links and "Model registry" in links and "Evaluation runs" not in links, links
    headers = page.eval_on_selector_all(".ag-header-row-column .ag-header-cell[col-id^='tags.']",
                                        "els => els.map(e => [e.getBoundingClientRect().x, e.getAttribute('col-id')])")
    assert [col for _, col in sorted(headers)] == [f"tags.`{k}`" for k in ("r", "C", "width", "N", "tokens", "loss")]
    # a row is split between the pinned name column (where a group's row says "Group: ...") and the others
    parts = page.eval_on_selector_all(".ag-row", """els => els.map(e => [
        Number(e.getAttribute('row-index')), e.innerText.includes('Group:'),
        (e.querySelector("[col-id='tags.`loss`']") || {}).innerText,
        (e.querySelector("[col-id='tags.`C`']") || {}).innerText])""")
    rows: dict[int, list] = {}
    for index, is_group, loss, budget in parts:
        row = rows.setdefault(index, [False, None, None])
        row[0] |= is_group
        row[1], row[2] = row[1] if loss is None else loss, row[2] if budget is None else budget
    groups = []  # per group, top to bottom: the loss of its runs; a group's own row shows no aggregate
    for _, (is_group, loss, budget) in sorted(rows.items()):
        if is_group:
            assert loss in ("", "-") and budget in ("", "-"), (loss, budget)
            groups.append([])
        elif loss not in ("", "-"):
            assert re.fullmatch(r"\d+\.\d{3}", loss) and re.fullmatch(r"\d\.\d{2}e\d+", budget), (loss, budget)
            groups[-1].append(float(loss))
    groups = [g for g in groups if g]  # the last group: runs without a cell
    assert len(groups) == 7  # 6 search cells + the calibration cell
    for group in groups:
        assert group == sorted(group), group
    assert [g[0] for g in groups] == sorted(g[0] for g in groups)

    (trial,) = [run for run in runs if run.data.tags.get("stage") == "calibrate"]  # trained: a real curve
    assert len(client.get_metric_history(trial.info.run_id, "train_loss")) > 2
    page.get_by_text(trial.info.run_name, exact=True).first.click()
    page.get_by_role("tab", name="Model metrics").click()
    card = "[data-testid=experiment-view-compare-runs-card]"
    page.locator(card).filter(has_text="val_loss").get_by_text("Step").first.wait_for(timeout=60_000)  # drawn
    titles = page.eval_on_selector_all(card, "els => els.map(e => e.innerText.split('\\n')[0].trim())")
    assert titles == ["train_loss", "val_loss"], titles
    page.screenshot(path=str(SHOTS / "trial_charts.png"), full_page=True)
