"""A Python started without some packages, as on a machine where they are not installed: a ``sitecustomize``
on PYTHONPATH puts a finder first on ``sys.meta_path`` that refuses those top-level names with the
ModuleNotFoundError a missing package gives. packrl itself is untouched; only the imports fail."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SITECUSTOMIZE = '''
import sys

BLOCKED = {blocked!r}


class _NotInstalled:
    """Refuses the blocked packages as if they were not installed."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled)
'''


def environment(folder: Path, blocked: set[str], **extra: str) -> dict:
    """The environment of a subprocess in which ``blocked`` cannot be imported (``folder`` holds the
    sitecustomize). HOME is ``folder`` too, so nothing reads or writes the user's own files."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=sorted(blocked)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    return {**env, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)]), "HOME": str(folder),
            "OMP_NUM_THREADS": "1", **extra}
