"""The error every part raises for a mistake in the user's input. It lives on the floor
so that agent, analyzer, trainer and dashboard raise it without importing the CLI,
which prints it as one line, never a traceback."""


class UserError(Exception):
    """A mistake in the user's input: printed as one line, no traceback."""
