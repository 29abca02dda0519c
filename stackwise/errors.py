"""The one exception type for user mistakes.

The CLI prints a StackWiseError as a single paragraph and exits non-zero; anything else is a bug
and keeps its traceback.
"""


class StackWiseError(Exception):
    """A problem the user can fix: the message names it and says how."""
