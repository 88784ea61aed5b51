"""The one domain error of sigprop (STYLE.md habit 7).

Library code raises :class:`SigpropError`; only the CLI turns it into a one-line
message and an exit code.  ``option`` names the CLI option at fault, if any.
"""

from __future__ import annotations


class SigpropError(Exception):
    """Any domain error: bad input, resources, unknown names.

    ``exit_code`` is 2 for usage errors (the default) and 1 for a failed check.
    """

    def __init__(self, message: str, *, option: str | None = None, exit_code: int = 2):
        super().__init__(message)
        self.option = option
        self.exit_code = exit_code

    def __str__(self) -> str:  # one line, naming the option
        msg = super().__str__()
        return f"{self.option}: {msg}" if self.option else msg
