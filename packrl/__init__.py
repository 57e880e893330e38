"""packrl: reinforcement learning on structured spaces, packed losslessly into uint8 rows."""
from packrl.errors import EmulationError, EnvError, NativizeError, PackrlError

__version__ = "0.1.0"
__all__ = ["EmulationError", "EnvError", "NativizeError", "PackrlError", "__version__"]
