"""The MLflow store contract, shared by the search (which writes) and the analysis (which reads).

One home for what both sides must agree on: the tag that says what a run is (``loopscale.kind`` = sweep, trial
or analysis), where a store is when nobody names one, how a password in a URI is hidden, how a store is checked
before MLflow touches it, how runs are paged through, and how the sweep's driver lock is read (``lock_holder``:
analyze says whether a driver still runs the sweep it fits, reading the lock without taking it). Imports MLflow
only (never Ray): the analysis runs without the search's dependencies.

Which store (the first that is set wins)::

    --tracking-uri  >  the spec's tracking_uri  >  $MLFLOW_TRACKING_URI  >  sqlite:///<cwd>/loopscale-runs/mlflow.db

Checks (every failure is a ValueError of one line, the URI's password shown as ``***``):

* sqlite: a file that exists must be an SQLite database holding MLflow's tables, or hold no table at all. A
  database without tables is treated as no database: the search may create its store there; a command that
  only reads refuses it, since MLflow would otherwise build its schema, writing where the user meant to read.
  Other programs' databases and corrupted files are refused (MLflow would fail deep inside SQLAlchemy, or add
  its tables to someone else's database). Checked read-only: the check writes nothing.
* http(s): the server's ``/health`` must answer HTTP 200, and a read of its experiments no server error, each
  within a few seconds (MLflow's own client retries for minutes).
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import os
import re
import socket
import sqlite3
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

KIND_TAG = "loopscale.kind"  # "sweep" | "trial" | "analysis"
CALIBRATION_TAG = "calibration"  # the sweep run's JSON of its calibration's choice (analysis/calibration.py)
SUPPRESS_URLS = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"  # else MLflow prints each run's URL, password included
TRACKING_ENV = "MLFLOW_TRACKING_URI"
DEFAULT_RUN_DIR = "loopscale-runs"  # the search's outputs (store, Tune storage, cache, analysis) by default
DEFAULT_STORAGE = "tune"  # the search's Tune storage, under DEFAULT_RUN_DIR unless the spec names one
# ``<storage>/<sweep>/driver.lock``: JSON {host, pid, process_start, since} of the one driver running the sweep
LOCK_FILE = "driver.lock"
HEALTH_TIMEOUT_S = 5.0
API_PROBE = "/api/2.0/mlflow/experiments/search?max_results=1"  # the cheapest read of a server's own store
PAGE_SIZE = 1000
# the metric names objectives/trial.py (BRANCH_KEYS) gives a warmdown branch's values (analysis does not import
# objectives): the trial run's metrics in the store, the runs table's columns after reading
BRANCH_COLUMN = re.compile(r"^branch(\d+)\.(budget_flops|tokens|steps|flops_spent|val_loss|cost_flops)$")
# A kept model's validation loss at r_eval recurrences (``loopscale evaluate``, search/evaluate.py): the metric on its
# trial run, and the runs table's column (analysis/depth.py)
EVAL_COLUMN = re.compile(r"^val_loss_r(\d+)$")


def eval_column(r_eval: int) -> str:
    """The metric (and column) of a kept model's validation loss at ``r_eval`` recurrences."""
    return f"val_loss_r{r_eval}"


# A trial run's numbers. Only its curves are MLflow metrics, so that the run's charts in the UI are its loss
# curves (the UI draws a chart per metric, single points too): ``train_loss`` over the steps and the final
# ``val_loss`` (kept a metric: the runs table sorts by it). Every other number of a trial (sizes, tokens, FLOPs,
# s, r, lr, wall time, its warmdown branches' and module's values, evaluations at other r, a rung's prediction)
# has one value and lives in one JSON tag at full precision, written by search (tracking.py, evaluate.py,
# validate.py). Sweeps logged before kept them all as metrics: ``trial_numbers`` reads both.
CHARTED = ("train_loss", "val_loss")
NUMBERS_TAG = "loopscale.numbers"


class DamagedNumbers(ValueError):
    """A run's ``NUMBERS_TAG`` that does not read back as one JSON object of numbers: ``run`` names the run,
    ``detail`` what is wrong; its one line says both."""

    def __init__(self, detail: str, run: str = "") -> None:
        self.detail, self.run = detail, run
        super().__init__(f"run {run}: {detail}" if run else detail)


def numbers_tags(numbers: dict[str, float], run: Any = None) -> dict[str, str]:
    """The tags that hold ``numbers`` over those ``run`` holds already: their JSON in ``NUMBERS_TAG``, continued
    in ``NUMBERS_TAG.1``, ``.2``, ... past MLflow's tag length (a module may report many values), then one empty
    piece that ends them. Every further piece ``run`` holds (an earlier, longer text's) is emptied too, so no
    stale piece is ever read after the new text. A ``run`` whose numbers are damaged raises ``DamagedNumbers``."""
    from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

    held = run.data.tags if run is not None else {}
    text = json.dumps({**(trial_numbers(run, metrics=False) if run is not None else {}), **numbers}, sort_keys=True)
    pieces = [text[i:i + MAX_TAG_VAL_LENGTH] for i in range(0, len(text), MAX_TAG_VAL_LENGTH)] + [""]
    last_held = max((i for i in map(_piece_index, held) if i is not None), default=-1)
    pieces += [""] * (last_held + 1 - len(pieces))
    return {_numbers_piece(i): piece for i, piece in enumerate(pieces)}


def trial_numbers(run: Any, *, metrics: bool = True) -> dict[str, float]:
    """Every number of a trial run (``CHARTED``'s latest values, and the single-valued ones) by name, whether
    its sweep logged them as metrics (before) or in ``NUMBERS_TAG``; only the tag's with ``metrics`` False.
    ``DamagedNumbers`` names the run when its tag is not a JSON object of numbers (a piece garbled, cut short, or
    a stale one left by an older writer)."""
    try:
        tagged = _tagged_numbers(run.data.tags)
    except DamagedNumbers as exc:
        raise DamagedNumbers(exc.detail, f"{run.info.run_id} ({run.info.run_name or 'unnamed'})") from None
    return {**run.data.metrics, **tagged} if metrics else tagged


def _numbers_piece(i: int) -> str:
    return NUMBERS_TAG if i == 0 else f"{NUMBERS_TAG}.{i}"


def _piece_index(tag: str) -> int | None:
    """The index of a tag that is a piece of ``NUMBERS_TAG`` (0 for the tag itself), else None."""
    if tag == NUMBERS_TAG:
        return 0
    rest = tag.removeprefix(f"{NUMBERS_TAG}.")
    return int(rest) if rest != tag and rest.isdigit() else None


def _tagged_numbers(tags: dict[str, str]) -> dict[str, float]:
    """The numbers of ``NUMBERS_TAG``'s pieces, read up to the first missing or empty one."""
    pieces = itertools.takewhile(bool, (tags.get(_numbers_piece(i)) for i in itertools.count()))
    text = "".join(pieces)
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise DamagedNumbers(f"its {NUMBERS_TAG} tag is not valid JSON ({exc}; {len(text)} characters)") from None
    if not isinstance(value, dict):
        raise DamagedNumbers(f"its {NUMBERS_TAG} tag holds a JSON {type(value).__name__}, not an object of numbers")
    wrong = next((key for key, v in value.items() if isinstance(v, bool) or not isinstance(v, (int, float))), None)
    if wrong is not None:
        raise DamagedNumbers(f"its {NUMBERS_TAG} tag holds {type(value[wrong]).__name__} {value[wrong]!r} at "
                             f"{wrong!r}, not a number")
    return value


# A factory's options are one param, their JSON, so that their types survive the store (a param is a string,
# and ``1.0`` or ``"1"`` flattened as text read back as the int 1): written by search/tracking.py, read by
# analysis/runs.py. An older version logged them flat, as ``template.options.<name>`` = str(value).
OPTIONS_PARAM = "template.options"
# A URI's scheme and everything after it up to a space or quote. Its credentials run to the LAST '@' (a
# password may hold '@', '/' or ':' unescaped: users paste them so); the user ends at the first ':'.
_URI = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<rest>[^\s\"'<>`]*)")


def redact(text: str) -> str:
    """``text`` (a URI, a message, a TOML file) with the password of every ``scheme://user:password@host`` in it
    replaced by ``***``: safe to print or log. Any user, empty or not; any '@', '/' or ':' in the password."""
    def hide(match: re.Match) -> str:
        credentials, at, host = match["rest"].rpartition("@")
        user, colon, _ = credentials.partition(":")
        if not at or not colon:
            return match[0]
        return f"{match['scheme']}{user}:***@{host}"

    return _URI.sub(hide, text)


def print_error(message: str, code: int) -> int:
    """A command's one ``loopscale: error:`` line on stderr, and ``code``. Every command's error leaves through
    here (search/cli.py and analysis/cli.py), so here is where a URI's password is hidden, whoever wrote the
    message: MLflow's and requests' exception texts quote the URL they asked, credentials included."""
    print(f"loopscale: error: {redact(message)}", file=sys.stderr)
    return code


def store_failure_types() -> tuple[type[Exception], ...]:
    """What MLflow's clients raise when the store itself fails (a server answering HTTP 500 or gone, a
    read-only or deleted sqlite file, a full disk). Imported when asked: MLflow's import takes seconds."""
    import requests
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    return (MlflowException, sqlalchemy.exc.SQLAlchemyError, requests.RequestException, OSError)


def failure_text(exc: BaseException) -> str:
    """``exc`` as one line: its type and the first line of its message (MLflow's run to a whole traceback of
    the server's), at most 300 characters. Not yet redacted: the command line redacts what it prints."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def without_credentials(uri: str) -> str:
    """The URI with its ``user:password@`` removed, cut the same way as ``redact`` cuts it."""
    match = _URI.match(uri)
    if match is None or "@" not in match["rest"]:
        return uri
    return match["scheme"] + match["rest"].rpartition("@")[2]


def default_tracking_uri() -> str:
    """The store of every command that is told of none: a sqlite file under ./loopscale-runs."""
    return f"sqlite:///{Path.cwd() / DEFAULT_RUN_DIR / 'mlflow.db'}"


def resolve_tracking_uri(*given: str | None) -> str:
    """The first URI of ``given`` that is set (the flag first, then the spec's), else ``$MLFLOW_TRACKING_URI``,
    else the default store."""
    for uri in (*given, os.environ.get(TRACKING_ENV)):
        if uri:
            return uri
    return default_tracking_uri()


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (query string dropped), else None."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def check_store(uri: str, *, create: bool = False) -> None:
    """Refuse, with one line, a store MLflow could not use; ``create`` when the caller may create it (the search)
    rather than only read it. Writes nothing."""
    shown = redact(uri)
    scheme = urllib.parse.urlsplit(uri).scheme
    if scheme == "sqlite":
        path = sqlite_path(uri)
        if path is None or uri.removeprefix("sqlite:///").split("?", 1)[0] in ("", ":memory:"):
            raise ValueError(f"tracking URI {shown!r} must name a database file, e.g. sqlite:////abs/path/mlflow.db")
        _check_sqlite(path, create=create, uri=shown)
    elif scheme in ("http", "https"):
        check_server(uri)
    else:
        raise ValueError(f"tracking URI {shown!r}: use sqlite:///path/to/mlflow.db or an http(s):// MLflow server")


def _check_sqlite(path: Path, *, create: bool, uri: str) -> None:
    if path.exists():
        if not (path.is_file() and os.access(path, os.R_OK | (os.W_OK if create else 0))):
            raise ValueError(f"tracking database {path} is not a readable{' and writable' if create else ''} file")
        tables = sqlite_tables(path)
        if tables and not {"experiments", "runs"} <= tables:
            raise ValueError(f"tracking database {path} is an SQLite database but not MLflow's (no experiments "
                             "and runs tables)")
        if tables or create:
            return
    elif create:
        parent = path.parent
        while not parent.exists():
            parent = parent.parent
        if not (parent.is_dir() and os.access(parent, os.W_OK)):
            raise ValueError(f"tracking database {path} cannot be created: {parent} is not writable")
        return
    raise ValueError(f"no MLflow database at {path} (tracking URI {uri}); run `loopscale search` first or pass "
                     "--tracking-uri")


def sqlite_tables(path: Path) -> set[str]:
    """The table names of an SQLite file, opened read-only (an empty file is an empty database)."""
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as exc:
        raise ValueError(f"tracking database {path} is not a readable SQLite database: {exc}") from None


def check_server(uri: str, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
    """An MLflow server must answer ``/health`` with HTTP 200, and a read of its API (``API_PROBE``) with no
    server error: a server whose own store fails answers /health and HTTP 500 to every call, which MLflow's client
    retries for minutes before it says a word. Both are asked without the URI's credentials: /health needs no
    login, they travel in MLFLOW_TRACKING_USERNAME/PASSWORD anyway, and the API's refusal of a login it lacks
    (HTTP 401 or 403) says the server runs."""
    status = _status(uri, "/health", timeout_s)
    if status != 200:
        raise ValueError(f"tracking server {redact(uri)} answered /health with HTTP {status}")
    status = _status(uri, API_PROBE, timeout_s)
    if status >= 500:
        raise ValueError(f"tracking server {redact(uri)} answers /health but failed a read of its experiments with "
                         f"HTTP {status} (its own store failing?)")


def _status(uri: str, path: str, timeout_s: float) -> int:
    """The HTTP status the server at ``uri`` answers ``path`` with; one line for a server that cannot be reached
    or answers no HTTP."""
    try:
        with urllib.request.urlopen(without_credentials(uri).rstrip("/") + path, timeout=timeout_s) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError) as exc:
        raise ValueError(f"tracking server {redact(uri)} is unreachable: {getattr(exc, 'reason', exc)}") from None
    except http.client.HTTPException:  # a database's or Ray's port, say: it answers, but not in HTTP
        raise ValueError(f"tracking server {redact(uri)} answered {path} with something that is not HTTP "
                         "(another service's port?)") from None


def runs_query(kind: str, **tags: str) -> str:
    """An MLflow filter for runs of one ``kind`` carrying the given tag values."""
    return " and ".join([f"tags.`{KIND_TAG}` = '{kind}'", *(f"tags.`{k}` = '{v}'" for k, v in tags.items())])


def iter_runs(client: Any, experiment_id: str, query: str, *, active_only: bool = True) -> Iterator[Any]:
    """Every run of the experiment matching ``query``, page by page (MLflow returns at most a page per call)."""
    from mlflow.entities import ViewType

    view = ViewType.ACTIVE_ONLY if active_only else ViewType.ALL
    token = None
    while True:
        page = client.search_runs([experiment_id], query, run_view_type=view, max_results=PAGE_SIZE,
                                  page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def process_start(pid: int) -> str:
    """The start time of process ``pid`` in clock ticks since boot (/proc/<pid>/stat field 22), "" if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[19]  # after the command name, which may hold spaces


def holder_alive(holder: dict[str, Any]) -> bool:
    """Whether the driver named in a lock still runs; True when that cannot be told (another host). A pid
    whose process started at another time than the lock records is another process under a recycled pid."""
    if holder.get("host") != socket.gethostname():
        return True
    pid = int(holder.get("pid", 0))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but another user's
        pass
    started = process_start(pid)
    return not (started and holder.get("process_start") and started != holder["process_start"])


def lock_holder(sweep_folder: Path) -> dict[str, Any] | None:
    """The driver named in ``<sweep_folder>/driver.lock``, or None when there is no readable lock; reads only."""
    try:
        holder = json.loads((sweep_folder / LOCK_FILE).read_text())
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None
