"""The ``multihead`` command line.

Every user error exits with status 2 and a one-line message, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


class UsageError(Exception):
    """A problem with the user's input: printed as one line, exit status 2."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except (UsageError, ValueError, TypeError, FileNotFoundError, PermissionError) as err:
        print(f"multihead {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"multihead {args.command}: interrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="multihead", description=__doc__.splitlines()[0])
    from . import __version__

    parser.add_argument("--version", action="version", version=f"multihead {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser("demo", help="walk through multi-head attention step by step, then on the real model")
    demo.add_argument("--model", default="minilm", help="Hugging Face BERT-family model: 'minilm' or a local folder")
    demo.add_argument("--no-model", action="store_true", help="skip the real-model part")
    demo.set_defaults(run=_run_demo)
    return parser


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(model=None if args.no_model else args.model)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
