"""Errors a user can cause and fix: a missing file, a bad column, a bad size.

Raising `UserError` means "print this one message and stop": the entry point shows it without a
traceback. Anything else is a bug in lightbert and keeps its traceback.
"""


class UserError(Exception):
    """A mistake in the user's input or config, with a message that says what to do."""


class ConfigError(UserError, ValueError):
    """A config value that can't work, e.g. a hidden size not divisible by the number of heads."""
