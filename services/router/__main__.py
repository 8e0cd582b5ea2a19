"""Entry point: see services/router/main.py."""

import sys

from services.router.main import main

if __name__ == "__main__":
    sys.exit(main())
