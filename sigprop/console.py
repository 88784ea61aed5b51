"""The ``sigprop`` console script.  It imports nothing but the standard library before it runs,
so that Ctrl-C while the CLI loads (typer, the commands' modules: about half a second) is the
same one line and exit 130 as Ctrl-C while it runs -- 0.15.0's entry point, ``sigprop.cli:run``,
printed a 35-line KeyboardInterrupt traceback from inside the imports."""

from __future__ import annotations

import sys

INTERRUPTED = 130


def run() -> None:
    try:
        from sigprop.cli import main  # typer and every command's module

        code = main()
    except KeyboardInterrupt:  # while the CLI loads (main says it itself once running)
        sys.stderr.write("sigprop: interrupted\n")
        code = INTERRUPTED
    sys.exit(code)
