"""The errors that end a run with one line and exit status 2 (bad input), never a traceback.

Each message names what is wrong: the dotted config key, the ``file:line`` of a data row, the
model spec. They live at the bottom of the package so that every layer can raise them.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad config value; str(error) is one line naming the key."""


class DataError(ConfigError):
    """A bad data file or row; str(error) names the file and line."""


class ModelLoadError(RuntimeError):
    """A model spec that cannot be loaded; the message says which spec and why."""
