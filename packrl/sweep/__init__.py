"""Hyperparameter search on Optuna (``packrl sweep``): the search space from the settings themselves
(``space``), what a trial is judged by (``objective``), the study database (``storage``), the sweep that runs
trials as processes (``study``, ``trial``), what a person sees (``view``, ``show``, ``dashboard``).
Needs the sweep extra: ``pip install 'packrl[sweep]'``."""
