"""Exceptions raised by packrl. Each message names the leaf path, agent, worker or env index."""


class PackrlError(Exception):
    """Base class of every packrl error."""


class EmulationError(PackrlError, ValueError):
    """A space cannot be packed, or a sample or action does not fit its space."""


class NativizeError(PackrlError, TypeError):
    """Rows handed to nativize are not uint8 rows of the layout's width."""


class EnvError(PackrlError, RuntimeError):
    """An environment failed inside a vector backend (worker id, env index and traceback attached)."""
