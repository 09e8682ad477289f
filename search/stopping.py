"""Why a sweep stops before every planned trial has its run: a signal, or a store or disk that failed.

The driver holds one ``StopRequest`` per ``run_search``. The first SIGINT (Ctrl-C) or SIGTERM asks for a clean
stop: trials that finished are logged, running ones are left for ``--resume``, and the command exits with
128 + the signal number (130, 143) and one line saying how to resume. A second signal aborts at once. A failing
MLflow store or a full disk asks for the same clean stop, and the command ends with one error line instead of a
traceback per trial. Nothing here knows Ray: ``search/tune`` turns a request into Tune's own graceful stop.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class SweepInterrupted(BaseException):
    """A signal stopped the sweep cleanly; the exit code is 128 + the signal number. A BaseException, like
    KeyboardInterrupt, so that no ``except Exception`` on the way (Tune's, MLflow's) swallows it."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class SweepAborted(SweepInterrupted):
    """A second signal while the sweep was stopping: no more clean-up, out now."""


class StoreFailure(RuntimeError):
    """The MLflow store or the disk under the sweep's storage failed; the message is one line."""


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


_received: list[int] = []  # signals ``interrupt`` handled, in order (see there)


def take_signals() -> dict[int, Any]:
    """Install ``interrupt`` for SIGINT and SIGTERM (main thread only); the previous handlers, for
    ``restore_signals``. The first thing ``loopscale`` does, before it imports anything slow. An exception of
    ``interrupt`` that Python swallows on the way (an extension module's callback while it imports: "Exception
    ignored in: 'cls_name'", 1 of 6 SIGTERMs in the first second under load) goes unreported: the signal is
    noted, and ``raise_if_interrupted`` acts on it in one line."""
    _received.clear()
    if threading.current_thread() is not threading.main_thread():
        return {}
    if not isinstance(sys.unraisablehook, _UnlessASignal):
        sys.unraisablehook = _UnlessASignal(sys.unraisablehook, lambda: bool(_received))
    return {s: signal.signal(s, interrupt) for s in SIGNALS}


class _UnlessASignal:
    """An unraisable-exception hook that passes on everything but a signal's own exception (``SystemExit``,
    ``KeyboardInterrupt``, ``SweepInterrupted``), which the caller acts on from the signal it noted; and, once a
    signal has arrived (``arrived()``), nothing: what Python swallows after it is its consequence (a library's
    fork hook cut short by the signal's exception fails in the next one: filelock's ``_resume_parent_after_fork``,
    an IndexError, 1 SIGTERM of a suite's while Ray started), and the command's one line says what happened."""

    def __init__(self, reporting: Any, arrived: Callable[[], bool]):
        self.reporting, self.arrived = reporting, arrived

    def __call__(self, unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, (SystemExit, KeyboardInterrupt, SweepInterrupted)) or self.arrived():
            return
        self.reporting(unraisable)


def restore_signals(previous: dict[int, Any]) -> None:
    """Put back handlers ``signal.signal`` returned; None (one installed outside Python) becomes the default."""
    for s, handler in previous.items():
        signal.signal(s, signal.SIG_DFL if handler is None else handler)


def interrupt(signum: int, frame: Any) -> None:
    """SIGINT or SIGTERM before a sweep takes them over (imports, the spec, another subcommand): out at once,
    as KeyboardInterrupt for SIGINT (what ``loopscale ui`` waits for) and ``SweepInterrupted`` for SIGTERM.
    The signal is noted too, as CPython 3.11's ``compile`` drops an exception that a handler raises while it
    runs: an import that compiles a module without a current .pyc loses it, so ``raise_if_interrupted`` raises
    it again after the imports."""
    _received.append(signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SweepInterrupted(signum, f"interrupted by {signal_name(signum)}")


def noted_interrupt() -> SweepInterrupted | None:
    """``SweepInterrupted`` for the first signal ``interrupt`` handled since ``take_signals``, or None."""
    return SweepInterrupted(_received[0], f"interrupted by {signal_name(_received[0])}") if _received else None


def raise_if_interrupted() -> None:
    """Raise ``noted_interrupt()``, if any."""
    if (interrupted := noted_interrupt()) is not None:
        raise interrupted


@contextmanager
def signals_noted() -> Iterator[list[int]]:
    """The signals that arrived inside the block (SIGINT, SIGTERM, any other with a Python handler), in order,
    filled in when it ends: whichever handler ran, and even where its exception was swallowed (Python ignores
    an exception raised inside, e.g., a ``__del__`` or ``logging``'s ``_releaseLock``, as a SIGTERM during
    ``ray.init`` can be, the sweep then running to its end). Python's own C-level handler writes each
    signal's number to the wakeup fd (``signal.set_wakeup_fd``), a pipe here. Main thread only (elsewhere
    nothing is noted).

    Python also reports such a swallowed exception on stderr ("Exception ignored in: <function _releaseLock>",
    a traceback ending in Ray's ``sys.exit(15)``, for a SIGTERM while Ray starts:
    tests/benchmarks/bench_start_signals.py). Inside the block a signal's exception (``SystemExit``,
    ``KeyboardInterrupt``, ``SweepInterrupted``) goes unreported, since the caller acts on the noted signal
    and says it in one line; any other goes to the hook there was until a signal arrives (``_UnlessASignal``)."""
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return
    reader, writer = os.pipe()
    for fd in (reader, writer):
        os.set_blocking(fd, False)
    previous = signal.set_wakeup_fd(writer)
    def arrived() -> bool:
        try:
            noted.extend(os.read(reader, 4096))
        except BlockingIOError:  # nothing (more) arrived
            pass
        return bool(noted)

    reporting = sys.unraisablehook
    sys.unraisablehook = _UnlessASignal(reporting, arrived)
    try:
        yield noted
    finally:
        sys.unraisablehook = reporting
        signal.set_wakeup_fd(previous)
        arrived()
        os.close(reader)
        os.close(writer)


class StopRequest:
    """Set from a signal handler or the tracking callback; read by the driver between and inside Tune runs.

    ``in_tune``: the driver is inside ``Tuner.fit``, where a stop is handed to Tune (which then saves its state
    and returns) instead of raised where the signal lands.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Nothing asked yet: a new sweep."""
        self.signum: int | None = None
        self.failure = ""
        self.in_tune = False

    @property
    def requested(self) -> bool:
        return self.signum is not None or bool(self.failure)

    def fail(self, message: str) -> None:
        """The store or disk failed: the first failure's line is the one reported."""
        self.failure = self.failure or message

    def on_signal(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            raise SweepAborted(signum, f"aborted by a second {signal_name(signum)}; trials that were running "
                                       "start again on --resume")
        self.signum = signum
        if not self.in_tune:  # nothing to wait for: the command's one line says it
            raise SweepInterrupted(signum, f"interrupted by {signal_name(signum)}")
        print(f"loopscale: {signal_name(signum)} received: stopping the sweep cleanly (finished trials are "
              "logged; send it again to abort)", file=sys.stderr, flush=True)

    @contextmanager
    def handling_signals(self) -> Iterator[None]:
        """Our handlers for SIGINT and SIGTERM inside the block (main thread only: Python allows no other);
        the previous ones afterwards. Re-entering (after ``ray.init`` set its own SIGTERM handler) re-installs."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.getsignal(s) for s in SIGNALS}
        try:
            self.install()
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                signal.signal(s, self.on_signal)
