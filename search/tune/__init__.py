"""Ray Tune + Optuna: the one package of loopscale that imports Ray (its APIs churn); Optuna only here and in the
law sampler (``search/law_sampler.py``).

A stage (``calibrate``, ``search`` or the rungs' ``validate``) is one Tune run over ALL its cells side by side.
One Tune searcher (``searcher.CellSearcher``, over the Ray-free ``cells.CellTrials``) holds a seeded Optuna study
per cell (``studies.CellStudy``, ask/tell) and hands each free slot to the cell ``search/dispatch.py`` picks, so no
cell waits for another and every cell's study sees its earlier results. The trial on a worker is ``trial.run_trial``;
its final result is kept as a receipt (``receipts``); the driver (``driver.run_search``) runs each stage
(``stage``) on a Ray it starts or joins (``cluster``), logging to MLflow and printing progress through Tune
callbacks (``callbacks``), which reach the driver's stop request and live searchers by name (``live``).

The package imports nothing itself, so ``studies`` (Optuna only) loads without Ray.
"""

import os

# Read when Ray is imported (every module of this package that imports Ray does so after this line): without it,
# the driver's Ray core installs a C++ crash handler that turns a SIGTERM (while ray.init connects, before the
# sweep takes the signal back) into a stack dump and an abort (cluster.start_ray).
os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
# Tune's own per-trial result files (result.json, progress.csv, TensorBoard events): the sweep's record is MLflow
# and its receipts, so they would be bytes and CPU at every report, and TensorBoardX loads torch into the driver.
os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
