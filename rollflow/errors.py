"""The one error type the CLI turns into a one-line message and exit status 2.

Anything the user can fix (a config key, a missing file, a bad flag) raises a subclass, so the
CLI can tell it apart from a bug, which keeps its traceback.
"""


class UserError(ValueError):
    """A problem in the user's input, explained in the message."""
