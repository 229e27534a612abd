"""User-facing errors.

Anything raised as a `UserError` (bad file, bad flag, impossible config, missing hardware) is printed
by the CLI as one line, `trainlab: error: <message>`, with exit code 2 and no traceback. Messages
name the file or flag and say what was expected.
"""


class UserError(Exception):
    """An error caused by the user's input or machine, not by a bug in trainlab."""


class DataError(UserError):
    """A dataset file is missing, truncated or inconsistent."""


class ConfigError(UserError):
    """A flag or configuration value is invalid or the combination is impossible."""


class HardwareError(UserError):
    """Required hardware or toolchain (GPU, compiler, NCCL…) is not available."""
