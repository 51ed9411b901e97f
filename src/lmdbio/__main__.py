"""``python -m lmdbio``: see lmdbio.cli."""

import sys

from lmdbio.cli import main

if __name__ == "__main__":
    sys.exit(main())
