"""Argument types every service's command line shares, so a bad flag gets the same precise
message everywhere (argparse turns ArgumentTypeError into "argument --port: …", exit code 2),
and :func:`read_text` for the files flags name (configs, secrets), whose every failure is one
:class:`UnreadableFile` naming the file and the flag."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

from services.common.net import parse_address


def port(value: str) -> int:
    """A TCP port, 0 meaning "any free port"."""
    if not value.isdigit() or not 0 <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535, got {value!r}")
    return int(value)


def address(value: str) -> str:
    """``HOST:PORT`` (IPv6 as ``[::1]:PORT``), normalised."""
    try:
        return parse_address(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def output_file(value: str) -> Path:
    """A file the process will write (``--ready-file``): its directory must exist and be
    writable now, not found missing after the service is already listening."""
    path = Path(value)
    parent = path.parent
    if not value or path.is_dir():
        raise argparse.ArgumentTypeError(f"{value!r} is a directory, not a file")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{str(parent)!r} is not an existing directory")
    if not os.access(parent, os.W_OK | os.X_OK) or _cannot_write_in(parent):
        raise argparse.ArgumentTypeError(f"directory {str(parent)!r} is not writable")
    return path


def finite_float(
    low: float | None = None, high: float | None = None, *, low_open: bool = False
) -> Callable[[str], float]:
    """A float flag's type: a finite number (never ``nan`` or ``inf``, which ``float()`` takes)
    within ``[low, high]`` (``(low, high]`` when ``low_open``); either bound may be absent."""

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
        if not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {value!r}")
        below = low is not None and (number <= low if low_open else number < low)
        above = high is not None and number > high
        if below or above:
            raise argparse.ArgumentTypeError(f"must be {_bounds(low, high, low_open)}, got {value}")
        return number

    return parse


def _bounds(low: float | None, high: float | None, low_open: bool) -> str:
    if low is not None and high is not None:
        return f"within {'(' if low_open else '['}{low:g}, {high:g}]"
    if low is not None:
        return f"{'>' if low_open else '>='} {low:g}"
    return f"<= {high:g}"


positive_float = finite_float(0, low_open=True)
"""A finite number > 0 (a timeout, an interval, a grace period)."""

non_negative_float = finite_float(0)
"""A finite number >= 0."""

fraction = finite_float(0, 1)
"""A finite number within [0, 1]."""


def integer(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """An integer flag's type within ``[low, high]`` (either bound may be absent): a count,
    a concurrency, a number of tokens."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if (low is not None and number < low) or (high is not None and number > high):
            raise argparse.ArgumentTypeError(f"must be {_bounds(low, high, False)}, got {value}")
        return number

    return parse


positive_int = integer(1)
"""An integer >= 1 (a count, a concurrency)."""


def output_dir(value: str) -> Path:
    """A folder the process writes into, creating it (and its parents) if need be
    (``--state-dir``, ``--out``): it must be a writable folder already, or the nearest one
    that exists above it must be — not a file, found out after the work is done."""
    path = Path(value)
    if not value:
        raise argparse.ArgumentTypeError("expected a folder, got ''")
    if path.exists():
        if not path.is_dir():
            raise argparse.ArgumentTypeError(f"{value!r} is not a directory")
        if not os.access(path, os.W_OK | os.X_OK) or _cannot_write_in(path):
            raise argparse.ArgumentTypeError(f"directory {value!r} is not writable")
        return path
    if path.is_symlink():
        raise argparse.ArgumentTypeError(f"{value!r} is a broken symbolic link")
    ancestor = next(a for a in path.absolute().parents if a.exists())
    if not ancestor.is_dir():
        raise argparse.ArgumentTypeError(f"cannot create {value!r}: {str(ancestor)!r} is a file")
    why = "is not writable" if not os.access(ancestor, os.W_OK | os.X_OK) else None
    why = why or _cannot_make_in(ancestor)
    if why:
        raise argparse.ArgumentTypeError(
            f"cannot create {value!r}: directory {str(ancestor)!r} {why}"
        )
    return path


def _cannot_write_in(folder: Path) -> bool:
    """Whether creating a file in ``folder`` fails: ``os.access`` says yes to root everywhere,
    and to anyone on a read-only mount it cannot see (a probe file, removed at once)."""
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=folder):
            return False
    except OSError:
        return True


def _cannot_make_in(folder: Path) -> str | None:
    """Why a folder cannot be made in ``folder`` (``/proc``, a read-only mount: ``os.access``
    cannot tell root), or None: a probe folder, removed at once, so a bad flag leaves no trace."""
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(dir=folder, prefix=".probe-"))
    except OSError as err:
        return f"refuses new folders ({err.strerror or err})"
    return None


MAX_INPUT_BYTES = 16 * 1024 * 1024
"""The largest file :func:`read_text` reads: config and secret files are small, and a
``--profile /dev/zero`` must end in an error, not in the memory running out."""


class UnreadableFile(ValueError):
    """A file a flag names that cannot be used as text: ``reason`` says why in a few words
    (``No such file or directory``, ``not UTF-8 text (byte 0xff at offset 0)``); the message is
    ``[FLAG ]PATH: REASON``."""

    def __init__(self, path: str | os.PathLike[str], reason: str, flag: str | None = None) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        self.flag = flag
        super().__init__(f"{flag + ' ' if flag else ''}{self.path}: {reason}")


def read_text(
    path: str | os.PathLike[str], *, flag: str | None = None, max_bytes: int = MAX_INPUT_BYTES
) -> str:
    """The UTF-8 text of a file a flag names (a config, a secret). Every way it can fail — an
    OS error (missing, a directory, no permission), bytes that are not UTF-8, a file past
    ``max_bytes`` — raises :class:`UnreadableFile` naming the file (and ``flag``, if given)."""
    try:
        # O_NONBLOCK for the open only: a FIFO that nothing writes to would hold the open
        # (and the service's start) forever; it reads as empty instead. A pipe with a
        # writer (``--profile <(...)``) is then read to its end as usual.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            os.set_blocking(fd, True)
            data = f.read(max_bytes + 1)
    except OSError as err:
        raise UnreadableFile(path, err.strerror or str(err), flag) from None
    if len(data) > max_bytes:
        raise UnreadableFile(path, f"larger than {max_bytes:,} bytes", flag)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        byte = data[err.start]
        raise UnreadableFile(
            path, f"not UTF-8 text (byte {byte:#04x} at offset {err.start})", flag
        ) from None
