"""The planet simulator's command: ``python -m bench.planet --scenario deploy/sim/planet.yaml``.

The simulator itself is ``services/planet`` (a library the tests use too); this module is its
entry point among the benchmarks. See ``services/planet/main.py`` for the flags and
``docs/planet.md`` for the model.
"""

from __future__ import annotations

import sys

from services.planet.main import main

if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # before a run started (loading, checking): nothing to report
        print("interrupted", file=sys.stderr)
        sys.exit(130)
