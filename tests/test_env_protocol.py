"""The env protocol (packrl.env_protocol), the emulations' one base, and errors as structured fields.

- Every emulation is a RowEnv built on EmulatedRows; only the gymnasium emulation steps blocks
  (BlockStepper), and the runner finds its step_many through the protocol, not by class name.
- An env that fails inside a vector backend gives an EnvError whose fields say which env (and
  worker), on every backend and on the later "failed earlier" refusals; the fields survive pickling.
- packrl check reads the env index from the field, not from the message.
- Misuse of the vector API (envs that cannot share arrays) is a UsageError.
"""
import pickle

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from numba import njit
from pettingzoo.butterfly import knights_archers_zombies_v11
from pettingzoo.classic import tictactoe_v3

from packrl import EmulationError, EnvError, ObservationError, UsageError, vector
from packrl.check import Report, _env_failure
from packrl.emulation import emulate
from packrl.emulation.gymnasium_env import GymnasiumEmulation
from packrl.emulation.pettingzoo_env import AECEmulation, ParallelEmulation
from packrl.emulation.rows import BoxRow, EmulatedRows
from packrl.env_protocol import ROW_BUFFERS, BlockStepper, RowEnv, block_stepper
from packrl.envs.numba_env import NumbaEnv
from packrl.vector.numba_backend import make_numba
from packrl.vector.testing import ScriptedEnv, SeededFailure


def test_every_emulation_is_a_row_env_on_the_one_base():
    envs = [emulate(gymnasium.make("CartPole-v1")), emulate(ScriptedEnv()),
            emulate(knights_archers_zombies_v11.parallel_env()), emulate(tictactoe_v3.env())]
    assert [type(e) for e in envs] == [GymnasiumEmulation, GymnasiumEmulation, ParallelEmulation, AECEmulation]
    for env in envs:
        assert isinstance(env, EmulatedRows) and isinstance(env, RowEnv)
        assert env.autoreset is False
        for name in ROW_BUFFERS:
            assert getattr(env, name).shape[0] == env.num_agents
    # pass-through is decided in one place: a Box observation keeps its own rows, anything else is bytes
    cartpole, scripted = envs[0], envs[1]
    assert cartpole.passthrough and cartpole.observations.dtype == np.float32 and cartpole.observations.shape == (1, 4)
    assert isinstance(cartpole._obs_rows[0], BoxRow)
    assert not scripted.passthrough and scripted.observations.dtype == np.uint8
    assert isinstance(envs[0], BlockStepper) and not isinstance(envs[2], BlockStepper)
    for env in envs:
        env.close()


def test_block_stepper_needs_one_class_and_one_layout():
    a, b = emulate(ScriptedEnv()), emulate(ScriptedEnv())
    assert block_stepper([a, b]) is GymnasiumEmulation.step_many
    other = emulate(gymnasium.make("CartPole-v1"))
    assert block_stepper([a, other]) is None  # layouts differ
    parallel = emulate(knights_archers_zombies_v11.parallel_env())
    assert block_stepper([parallel]) is None  # no step_many


def test_a_box_row_refuses_what_its_box_refuses():
    env = emulate(gymnasium.make("CartPole-v1"))
    env.reset(seed=0)
    with pytest.raises(Exception, match="shape|dtype|float"):
        env._obs_rows[0].pack(np.zeros(5, np.float32))
    env._obs_rows[0].pack(np.arange(4, dtype=np.float32))
    assert env.observations[0].tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("backend,kwargs,worker", [
    ("serial", {}, None),
    ("multiprocessing", {"num_workers": 2, "main_envs": 0}, 1),
])
def test_env_error_fields_name_the_env_and_worker(backend, kwargs, worker):
    venv = vector.make(SeededFailure, 4, backend=backend, **kwargs)
    try:
        venv.reset(seed=0)
        with pytest.raises(EnvError) as caught:
            for _ in range(5):
                venv.step(np.zeros(4, np.int64))
        err = caught.value
        assert err.env_index == 3 and err.worker == worker
        assert "scripted failure at step 3" in err.env_traceback and "Traceback" in err.env_traceback
        again = pickle.loads(pickle.dumps(err))
        assert (again.env_index, again.worker, again.env_traceback, str(again)) == \
            (3, worker, err.env_traceback, str(err))
        with pytest.raises(EnvError, match="failed earlier") as later:
            venv.step(np.zeros(4, np.int64))
        assert later.value.env_index == 3
    finally:
        venv.close()


def test_check_reads_the_env_index_from_the_field():
    report = Report()
    # a message that names no env at all: the index can only come from the field
    reason = _env_failure(report, EnvError("the env blew up\nValueError: boom", env_index=5), "step 2")
    assert reason == "not run: the env failed at step 2"
    assert report.rows[-1][2] == "step 2, env 5: EnvError: ValueError: boom"
    report = Report()
    _env_failure(report, EnvError("env 7 raised: text that used to be parsed"), "reset")
    assert report.rows[-1][2].startswith("reset: EnvError")  # no field, no guessed index


class _BadObservation(ScriptedEnv):
    """Env 2 (seeded 2) returns an observation outside its space on its second step."""

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.bad = seed == 2
        return super().reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if getattr(self, "bad", False) and self.t == 2:
            obs = dict(obs, t=99)  # Discrete(16)
        return obs, reward, terminated, truncated, info


@pytest.mark.parametrize("backend,kwargs", [("serial", {}), ("multiprocessing", {"num_workers": 1, "main_envs": 0})])
def test_a_refused_observation_travels_as_observation_error(backend, kwargs):
    venv = vector.make(_BadObservation, 4, backend=backend, **kwargs)
    try:
        venv.reset(seed=0)
        with pytest.raises(EnvError) as caught:
            for _ in range(3):
                venv.step(np.zeros(4, np.int64))
        assert caught.value.env_index == 2 and caught.value.env_exception == "packrl.errors.ObservationError"
        assert "['t']" in caught.value.env_traceback
    finally:
        venv.close()
    single = emulate(_BadObservation())
    single.reset(seed=2)
    single.step(0)
    with pytest.raises(ObservationError, match=r"\['t'\]"):  # an EmulationError, as before
        single.step(0)
    assert issubclass(ObservationError, EmulationError)


def test_an_env_failure_names_what_it_raised():
    venv = vector.make(SeededFailure, 4, backend="serial")
    try:
        venv.reset(seed=0)
        with pytest.raises(EnvError) as caught:
            for _ in range(5):
                venv.step(np.zeros(4, np.int64))
        assert caught.value.env_exception == "builtins.RuntimeError"
    finally:
        venv.close()


@njit
def _nan_reset(state, obs, rng):
    obs[0] = 0.0


@njit
def _nan_step(state, action, obs, rng):
    obs[0] = np.nan if action == 1 else 0.5
    return 0.0, False, False


def test_a_numba_copy_writing_outside_its_space_names_its_index_in_the_field():
    spec = NumbaEnv("nan_writer", spaces.Box(-1, 1, (1,), np.float32), spaces.Discrete(2), {"unused": (1, np.int64)},
                    _nan_reset, _nan_step)
    env = make_numba(spec, 5)
    env.reset()
    with pytest.raises(EnvError, match="env index 3") as caught:
        env.step(np.array([0, 0, 0, 1, 0]))
    assert caught.value.env_index == 3


class _Wide(gymnasium.Env):
    observation_space = spaces.Box(0, 1, (3,), np.float32)
    action_space = spaces.Discrete(2)


def test_envs_that_cannot_share_the_arrays_are_a_usage_error():
    made = iter([ScriptedEnv(), _Wide()])
    with pytest.raises(UsageError, match="env 1 has .* all envs of a vector env must match"):
        vector.make(lambda: next(made), 2, backend="serial")
