"""Exceptions raised by packrl. Each message names the leaf path, agent, worker, env index, flag or file."""


EXIT_OK, EXIT_BAD_INPUT, EXIT_STOPPED_BY_ERROR, EXIT_SIGINT, EXIT_SIGTERM = 0, 2, 3, 130, 143
"""The commands' exit codes: done; a bad setting, folder or file (one line on stderr); stopped by an error once
training was under way; stopped by SIGINT (Ctrl-C); stopped by SIGTERM."""


class PackrlError(Exception):
    """Base class of every packrl error."""


class EmulationError(PackrlError, ValueError):
    """A space cannot be packed, or a sample or action does not fit its space."""


class ObservationError(EmulationError):
    """An env returned an observation that does not fit its observation space (raised where an emulated env
    packs it; in a vector env it arrives inside an EnvError whose ``env_exception`` names this class)."""


class NativizeError(PackrlError, TypeError):
    """Rows handed to nativize are not uint8 rows of the layout's width."""


class EnvError(PackrlError, RuntimeError):
    """An environment failed inside a vector backend. The message has the worker, the env index and the
    env's own traceback; the fields give them to code: ``env_index`` (the env that failed, None when the
    error is not one env's), ``worker`` (the worker process or actor, None in the main process),
    ``env_traceback`` (the failing env's formatted traceback) and ``env_exception`` (the qualified class
    name of what it raised, e.g. ``packrl.errors.ObservationError``), None where there is none."""

    def __init__(self, message: str, *, env_index: int | None = None, worker: int | None = None,
                 env_traceback: str | None = None, env_exception: str | None = None):
        super().__init__(message)
        self.env_index, self.worker, self.env_traceback = env_index, worker, env_traceback
        self.env_exception = env_exception

    def __reduce__(self) -> tuple:  # the fields survive pickling (Ray, multiprocessing)
        return (_env_error, (str(self), self.env_index, self.worker, self.env_traceback, self.env_exception))


class UsageError(PackrlError, ValueError, TypeError):
    """The API or a setting is used wrongly: a wrong kind or value of argument (an env id where an env creator
    goes, an unknown backend, workers that do not divide the envs, calls out of order). It is a ValueError and
    a TypeError, so code that caught what these raised before (EmulationError, a ValueError; the TypeError of
    calling a string) still catches it."""


class ConfigError(UsageError):
    """A config file, preset or command-line flag names a section, key or value that does not exist or does
    not fit (the message names the key, the value, what is expected and the file)."""


def _env_error(message: str, env_index: int | None, worker: int | None, env_traceback: str | None,
               env_exception: str | None = None) -> EnvError:
    return EnvError(message, env_index=env_index, worker=worker, env_traceback=env_traceback,
                    env_exception=env_exception)
