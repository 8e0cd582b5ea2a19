"""Entry point: see services/worker/main.py."""

import sys

from services.worker.main import main

if __name__ == "__main__":
    sys.exit(main())
