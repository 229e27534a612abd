"""User-facing errors.

Anything raised as a `UserError` (bad file, bad flag, impossible config, missing hardware) is printed
by the CLI as one line, `trainlab: error: <message>`, with the error's `exit_code` (2) and no
traceback. Messages name the file or flag and say what was expected.

Exit codes of `trainlab` (see `trainlab.cli.main`): 0 success; 1 an internal error (a bug: the
traceback is printed) or a check that found failures; 2 bad input (flags, files, hardware, an OSError
naming its path); 3 training diverged (a non-finite loss); 130 interrupted.

A message passes the text gate (`trainlab.text.shown`) when the error is made: a file name, a JSON
field or a lock holder's command line in it can hold escape sequences, a newline or bytes that are not
UTF-8, and the terminal gets one line of escapes instead.
"""

from trainlab.text import shown


class UserError(Exception):
    """An error caused by the user's input or machine, not by a bug in trainlab."""

    exit_code = 2

    def __init__(self, *args):
        super().__init__(*(shown(a) if isinstance(a, str) else a for a in args))


class DataError(UserError):
    """A dataset file is missing, truncated or inconsistent."""


class ConfigError(UserError):
    """A flag or configuration value is invalid or the combination is impossible."""


class HardwareError(UserError):
    """Required hardware or toolchain (GPU, compiler, NCCL…) is not available."""


class TrainingDiverged(UserError):
    """The loss became NaN or infinite: the run stopped, its last good checkpoint is kept."""

    exit_code = 3
