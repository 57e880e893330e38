"""What a sweep records on a study's trials, and how it counts them: shared by the sweep loop and its view."""
from __future__ import annotations

from optuna.trial import TrialState

OWNER = "packrl_owner"  # system attribute of a trial: the sweep (host:folder) running it
CUT = "cut"


def counts(trials: list) -> tuple[int, int]:
    """(finished trials that count toward --trials, trials running now) over the whole study."""
    done = sum(1 for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
               or (t.state == TrialState.FAIL and str(t.user_attrs.get("failure", CUT)).startswith("error")))
    return done, sum(1 for t in trials if t.state == TrialState.RUNNING)
