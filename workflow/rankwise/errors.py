"""The one exception type for bad user input, and the Python API's warning category.

Anything raised as :class:`RankwiseError` is shown by the CLI as one line
(``error: <message>``) with exit status 2 and no traceback.  Every message names
the file, row or column at fault and what to do about it.
"""


class RankwiseError(ValueError):
    """Bad input: a one-line, user-facing message that names the fix."""


class ProtocolHint(UserWarning):
    """The default protocol ran on data that looks made for another: the Python API's
    counterpart of the command line's ``note:`` line (one line, naming the keyword to
    pass).  Passing ``protocol`` explicitly silences it."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's first non-empty line for a one-line message (its type name when it
    has no text), cut at ``limit`` characters with an ellipsis that shows the cut."""
    line = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    if not line:
        return type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3].rstrip() + "..."
