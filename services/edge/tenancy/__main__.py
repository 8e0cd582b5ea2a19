"""Entry point: see services/edge/tenancy/cli.py."""

import sys

from services.edge.tenancy.cli import main

if __name__ == "__main__":
    sys.exit(main())
