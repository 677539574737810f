"""The single error type for bad user input.

Library functions raise :class:`UsageError` with a one-line message that names the bad value
and says what is accepted. The command line prints that line and exits with status 2; a
notebook shows it as an ordinary exception.
"""


class UsageError(ValueError):
    """Bad input from a user: message is one line, naming the value and what is accepted."""


def positive_int(value, name: str) -> int:
    """Return ``value`` as an int if it is a positive integer, else raise :class:`UsageError`."""
    try:
        as_int = int(str(value), 10)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be a positive integer, got {value!r}") from None
    if as_int <= 0:
        raise UsageError(f"{name} must be a positive integer, got {value!r}")
    return as_int


def one_of(value, accepted, name: str):
    """Return ``value`` if it is in ``accepted``, else raise :class:`UsageError` listing them."""
    if value not in accepted:
        listed = ", ".join(str(a) for a in accepted)
        raise UsageError(f"unknown {name} {value!r}; accepted: {listed}")
    return value


class RunFailure(RuntimeError):
    """An experiment's run failed (a rank raised, was killed or stalled; the disk was full).

    ``str(err)`` is one line naming the rank and the cause; ``err.detail`` holds the longer story
    (a rank's traceback) for a notebook or ``--verbose``. The command line prints the one line
    and exits with status 1.
    """

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail


class Stopped(RunFailure, KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a run and its files were removed: one line, like any RunFailure,
    and also a KeyboardInterrupt, so whatever stops on Ctrl-C (a notebook, pytest) still stops.
    The command line exits with 128 + ``signum`` (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, message: str, signum: int = 2):
        super().__init__(message)
        self.signum = signum
