"""The one domain error of sigprop (../shared/STYLE.md habit 7).

Library code raises :class:`SigpropError`; only the CLI turns it into a one-line message and an
exit code.  ``field`` names what is at fault in the library's own words -- a spec or probe
field (``depth``, ``input_dim``, ``samples``; several joined by ``/`` when any of them could be
reduced) or an input (``result``, ``results``, ``file``).  The CLI maps fields to its flags
(sigprop/cli/options.py ``flag``), ``sigprop check`` to the TOML keys of the check.
"""

from __future__ import annotations


class SigpropError(Exception):
    """Any domain error: bad input, resources, unknown names.

    ``exit_code`` is 2 for usage errors (the default) and 1 for a failed check.
    """

    def __init__(self, message: str, *, field: str | None = None, exit_code: int = 2):
        super().__init__(message)
        self.field = field
        self.exit_code = exit_code

    @property
    def message(self) -> str:
        return super().__str__()

    def __str__(self) -> str:  # one line, naming the field
        return f"{self.field}: {self.message}" if self.field else self.message


def described(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message (its type alone
    when it has none) -- how sigprop reports an error it did not raise itself."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class RolesGuessed(UserWarning):
    """``sigprop.init_`` could not read the roles of some weight layers from the model's graph
    (torch.fx cannot trace it and no input was given to export it on) and drew them as ReLU
    layers: the message names every one (issue 48)."""
