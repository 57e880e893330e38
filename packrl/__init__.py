"""packrl: reinforcement learning on structured spaces, packed losslessly into uint8 rows."""
from packrl.errors import (
    ConfigError,
    EmulationError,
    EnvError,
    NativizeError,
    ObservationError,
    PackrlError,
    UsageError,
)

__version__ = "0.1.0"
__all__ = ["ConfigError", "EmulationError", "EnvError", "NativizeError", "ObservationError", "PackrlError",
           "UsageError", "__version__"]
