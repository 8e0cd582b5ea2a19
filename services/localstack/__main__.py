"""Entry point: see services/localstack/main.py."""

import sys

from services.localstack.main import main

if __name__ == "__main__":
    sys.exit(main())
