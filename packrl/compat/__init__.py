"""Adapters to other libraries: ``packrl.compat.sb3`` (a Stable-Baselines3 ``VecEnv`` over a packrl
vector env, one SB3 env per agent row), ``packrl.compat.gymnasium`` (a ``gymnasium.Env`` view of
``emulate(env)``) and ``packrl.compat.pettingzoo`` (a PettingZoo Parallel or AEC env of packed rows over
``emulate(parallel_env)``). Each is imported on its own, so SB3 is needed only by the SB3 adapter."""
