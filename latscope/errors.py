"""Exceptions a user can act on. The CLI catches these once and maps them to exit codes."""


class LatscopeError(Exception):
    """Base class: the message is shown to the user as is."""


class ScenarioError(LatscopeError):
    """The scenario (file, --set override or referenced file) is invalid. Exit code 2."""


class RunError(LatscopeError):
    """The run could not be carried out (target would not start, workers died). Exit code 1."""


class ResultsError(LatscopeError):
    """A results directory (or one of its files) is missing or unreadable. The message names the file."""
