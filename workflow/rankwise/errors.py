"""The one exception type for bad user input.

Anything raised as :class:`RankwiseError` is shown by the CLI as one line
(``error: <message>``) with exit status 2 and no traceback.  Every message names
the file, row or column at fault and what to do about it.
"""


class RankwiseError(ValueError):
    """Bad input: a one-line, user-facing message that names the fix."""
