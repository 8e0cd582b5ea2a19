"""Profiles side by side: ``bench.planet --jobs N`` runs each profile in its own process.

A run is one core's work (the event loop is single-threaded), so comparing five profiles on
an hour of the planet takes five times one profile's time one after another. Here each
profile is a child process (``spawn``: nothing of the parent's state is shared by accident)
fed the validated :class:`~services.planet.scenario.Scenario`; the parent draws one progress
bar per profile from the children's reports and returns the results in the profiles' order,
exactly as the sequential path would (each run is deterministic on its own).

Ctrl-C: the children ignore SIGINT themselves (a terminal sends it to the whole process
group, and a second one mid-summary would lose the run); the parent sets a shared stop flag,
which each child reads once per simulated second and turns into the same interruption the
sequential path has (the run ends where it is and its report covers what ran). The parent
counts Ctrl-C in a signal handler instead of taking it as a KeyboardInterrupt: one raised
inside ``Queue.get`` can land between a message's length and its bytes, and every read after
it is garbage (``EOFError: Ran out of input``). Only a second Ctrl-C raises (stop waiting).
"""

from __future__ import annotations

import multiprocessing
import queue
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from services.planet.scenario import Scenario

RunOne = Callable[[Scenario, Path, str, Callable[[float], None] | None], dict[str, Any]]

_progress: Any = None  # the child's end of the parent's queue (set by _init)
_stop: Event | None = None


def _init(progress: Any, stop: Event) -> None:
    global _progress, _stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides (see the docstring)
    _progress, _stop = progress, stop


def _child(run_one: RunOne, sc: Scenario, profile: Path, label: str) -> dict[str, Any] | None:
    if _stop is not None and _stop.is_set():
        return None  # queued before Ctrl-C, reached after it: not started
    last = [-1]

    def report(t: float) -> None:
        n = int(t)
        if n > last[0]:
            last[0] = n
            _progress.put((label, n))
        if _stop is not None and _stop.is_set():
            raise KeyboardInterrupt  # caught by Planet.run: the run ends here, summarised

    return run_one(sc, profile, label, report)


def run_side_by_side(
    sc: Scenario,
    profiles: Sequence[Path],
    jobs: int,
    run_one: RunOne,
    *,
    progress: bool,
) -> tuple[list[dict[str, Any]], bool]:
    """(each profile's result in ``profiles``' order, whether Ctrl-C stopped them)."""
    ctx = multiprocessing.get_context("spawn")
    reports = ctx.Queue()
    stop = ctx.Event()
    labels = [p.stem for p in profiles]
    bars: dict[str, Any] = {}
    if progress:
        from tqdm import tqdm

        bars = {
            label: tqdm(
                total=round(sc.duration_s), unit="sim s", desc=label, position=i, file=sys.stderr
            )
            for i, label in enumerate(labels)
        }
    interrupted = False
    ctrl_c = _CtrlC()
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, ctrl_c) if in_main else None
    try:
        with ProcessPoolExecutor(
            max_workers=jobs, mp_context=ctx, initializer=_init, initargs=(reports, stop)
        ) as pool:
            futures: list[Future[dict[str, Any] | None]] = [
                pool.submit(_child, run_one, sc, prof, label)
                for prof, label in zip(profiles, labels, strict=True)
            ]
            while not all(f.done() for f in futures):
                _drain(reports, bars)
                if ctrl_c.count and not interrupted:
                    interrupted = True
                    stop.set()
                    for f in futures:  # the ones not started yet do not start
                        f.cancel()
                    print("interrupted: stopping every profile where it is", file=sys.stderr)
            _drain(reports, bars, wait=False)
    finally:
        if in_main:  # None: a handler not set from Python; Python's default then
            restore = signal.default_int_handler if previous is None else previous
            signal.signal(signal.SIGINT, restore)
    for bar in bars.values():
        bar.close()
    results = []
    for f, label in zip(futures, labels, strict=True):
        try:
            result = None if f.cancelled() else f.result()  # None: Ctrl-C came before it
        except BrokenProcessPool:  # killed (the kernel's OOM killer, a signal): say which
            unfinished = [n for g, n in zip(futures, labels, strict=True) if not _finished(g)]
            raise ProfileProcessDied(
                "a profile's process died before it finished (killed: out of memory? fewer "
                f"--jobs need less); unfinished: {', '.join(unfinished) or label}"
            ) from None
        if result is not None:
            results.append(result)
    return results, interrupted


def _finished(f: Future[dict[str, Any] | None]) -> bool:
    return not f.cancelled() and f.exception() is None


class _CtrlC:
    """SIGINT in the parent while children run: counted, not raised (see the docstring)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, signum: int, frame: object) -> None:
        self.count += 1
        if self.count > 1:  # a second Ctrl-C: stop waiting for the children
            raise KeyboardInterrupt


class ProfileProcessDied(RuntimeError):
    """A child process ended without a result."""


def _drain(reports: Any, bars: dict[str, Any], *, wait: bool = True) -> None:
    try:
        label, n = reports.get(timeout=0.2) if wait else reports.get_nowait()
        while True:
            bar = bars.get(label)
            if bar is not None and n > bar.n:
                bar.update(n - bar.n)
            label, n = reports.get_nowait()
    except queue.Empty:
        return
