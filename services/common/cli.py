"""Argument types every service's command line shares, so a bad flag gets the same precise
message everywhere (argparse turns ArgumentTypeError into "argument --port: …", exit code 2)."""

from __future__ import annotations

import argparse
import os
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
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"directory {str(parent)!r} is not writable")
    return path
