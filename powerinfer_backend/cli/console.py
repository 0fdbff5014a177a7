"""The ``powerinfer-backend`` console script (also ``python -m powerinfer_backend.cli.console``):
parse the arguments, run the subcommand, turn the errors a user can cause into one ``error:``
line and exit status 2."""

from __future__ import annotations

import sys

from .commands import warn_line
from .parser import build_parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    """warnings.showwarning for the command line: :func:`warn_line` (Python's default adds
    the file, line and source line of the warn() call)."""
    warn_line(message, file)


def main(argv=None) -> int:
    import warnings

    warnings.showwarning = _one_line_warning
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:  # Ctrl-C: stop quietly, with the shell's status for SIGINT
        print(file=sys.stderr)
        return 130
    except (ValueError, OSError, MemoryError, NotImplementedError, RuntimeError) as e:  # MemoryError: KV cache
        # too big; RuntimeError: ggml missing or of another version
        print(f"powerinfer-backend: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
