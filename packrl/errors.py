"""Exceptions raised by packrl. Each message names the leaf path, agent, worker, env index, flag or file."""


class PackrlError(Exception):
    """Base class of every packrl error."""


class EmulationError(PackrlError, ValueError):
    """A space cannot be packed, or a sample or action does not fit its space."""


class NativizeError(PackrlError, TypeError):
    """Rows handed to nativize are not uint8 rows of the layout's width."""


class EnvError(PackrlError, RuntimeError):
    """An environment failed inside a vector backend (worker id, env index and traceback attached)."""


class UsageError(PackrlError, ValueError, TypeError):
    """The API or a setting is used wrongly: a wrong kind or value of argument (an env id where an env creator
    goes, an unknown backend, workers that do not divide the envs, calls out of order). It is a ValueError and
    a TypeError, so code that caught what these raised before (EmulationError, a ValueError; the TypeError of
    calling a string) still catches it."""


class ConfigError(UsageError):
    """A config file, preset or command-line flag names a section, key or value that does not exist or does
    not fit (the message names the key, the value, what is expected and the file)."""
