"""Entry point: see services/edge/main.py."""

import sys

from services.edge.main import main

if __name__ == "__main__":
    sys.exit(main())
