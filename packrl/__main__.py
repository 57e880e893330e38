"""``python -m packrl``: the ``packrl`` command."""
import sys

from packrl.cli import main

sys.exit(main())
