"""The error every part raises for a mistake in the user's input. It lives on the floor
so that agent, analyzer, trainer and dashboard raise it without importing the CLI,
which prints it as one line, never a traceback."""
import re

# C0 and C1 controls, DEL, and the marks that reorder text: from a store or a file, these could
# move the cursor, recolour, retitle or clear the terminal that prints them.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


class UserError(Exception):
    """A mistake in the user's input: printed as one line, no traceback."""


def printable(text: str, keep: str = "") -> str:
    """`text` with each control character but those in `keep` written as its escape (`\\x1b`):
    what a terminal prints of anything read from elsewhere (errors, label values)."""
    return _CONTROLS.sub(lambda m: m.group() if m.group() in keep else m.group().encode("unicode_escape").decode(),
                         text)
