"""``with`` support and closing on garbage collection, for the owners of native handles."""

from __future__ import annotations

__all__ = ["Closing"]


class Closing:
    """``with`` support and closing on garbage collection for an object with ``close()``."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()
