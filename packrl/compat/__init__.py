"""Adapters to other libraries: ``packrl.compat.sb3`` (a Stable-Baselines3 ``VecEnv`` over a packrl
vector env) and ``packrl.compat.gymnasium`` (a ``gymnasium.Env`` view of ``emulate(env)``). Each is
imported on its own, so SB3 is needed only by the SB3 adapter."""
