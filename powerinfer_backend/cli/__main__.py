"""``python -m powerinfer_backend.cli``, as the old flat ``cli`` module ran."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
