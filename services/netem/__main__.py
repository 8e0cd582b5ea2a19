"""``python -m services.netem``: see :mod:`services.netem.cli`."""

from services.netem.cli import main

if __name__ == "__main__":
    main()
