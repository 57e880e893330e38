"""What an env's reset and step return, checked for shape before anything is stored: the pre-0.26 gym API
(an observation alone from reset, four values from step) and an info that is not a dict are refused naming
the env, the method and what it returned; a Parallel env's rewards, terminations and truncations need
a key for each live agent (a missing info reads as {} with one warning)."""
import warnings

import gymnasium as gym
import numpy as np
import pytest
from pettingzoo import ParallelEnv

from packrl import vector
from packrl.emulation import emulate
from packrl.errors import EmulationError, EnvError


class OldApi(gym.Env):
    """``mode``: how reset or step breaks the gymnasium API."""

    def __init__(self, mode: str, dict_obs: bool = False):
        self.mode = mode
        self.observation_space = gym.spaces.Dict({"a": gym.spaces.Discrete(3), "b": gym.spaces.Discrete(3)}) \
            if dict_obs else gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self):
        return {"a": 1, "b": 2} if isinstance(self.observation_space, gym.spaces.Dict) else np.zeros(2, np.float32)

    def reset(self, seed=None, options=None):
        if self.mode == "reset_obs_only":
            return self._obs()
        if self.mode == "reset_info_list":
            return self._obs(), [1, 2]
        return self._obs(), {}

    def step(self, action):
        if self.mode == "step4":
            return self._obs(), 1.0, False, {}
        if self.mode == "step6":
            return self._obs(), 1.0, False, False, {}, None
        if self.mode == "info_list":
            return self._obs(), 1.0, False, False, [1, 2]
        return self._obs(), 1.0, False, False, {}


@pytest.mark.parametrize("mode, dict_obs, method, message", [
    ("reset_obs_only", False, "reset", r"reset\(\) returned .*ndarray.*pre-0\.26 gym API.*shimmy"),
    ("reset_obs_only", True, "reset", r"reset\(\) returned \{'a': 1, 'b': 2\} \(dict\).*pre-0\.26 gym API"),
    ("reset_info_list", False, "reset", r"reset\(\) returned info=\[1, 2\] \(list\); it must be a dict"),
    ("step4", False, "step", r"step\(\) returned a tuple of 4 values .*: this is the pre-0\.26 gym API.*shimmy"),
    ("step6", False, "step", r"step\(\) returned a tuple of 6 values"),
    ("info_list", False, "step", r"step\(\) returned info=\[1, 2\] \(list\); it must be a dict"),
])
def test_wrong_shapes_are_named(mode, dict_obs, method, message):
    env = emulate(OldApi(mode, dict_obs))
    with pytest.raises(EmulationError, match=r"env test_env_api_shapes\.OldApi: " + message):
        env.reset(seed=0)
        env.step(np.zeros(1, np.int64))
    # the same through a vector env (its block step for steps), named by env index
    venv = vector.make(lambda: OldApi(mode, dict_obs), 2, backend="serial")
    try:
        with pytest.raises(EnvError, match=message) as caught:
            venv.reset(seed=0)
            venv.step(np.zeros(2, np.int64))
        assert caught.value.env_index == 0 and caught.value.env_exception == "packrl.emulation.step_checks.ReturnShapeError"
    finally:
        venv.close()


class Parallel(ParallelEnv):
    metadata = {"name": "parallel_shapes"}

    def __init__(self, drop: str | None = None, info_value=None):
        self.possible_agents = ["a", "b"]
        self.drop, self.info_value = drop, info_value

    def observation_space(self, agent):
        return gym.spaces.Discrete(3)

    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return {a: 0 for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        out = {"rewards": {a: 1.0 for a in self.agents}, "terminations": {a: False for a in self.agents},
               "truncations": {a: False for a in self.agents}, "infos": {a: {} for a in self.agents}}
        if self.drop is not None:
            del out[self.drop]["b"]
        if self.info_value is not None:
            out["infos"]["b"] = self.info_value
        return {a: 1 for a in self.agents}, out["rewards"], out["terminations"], out["truncations"], out["infos"]


@pytest.mark.parametrize("drop", ["rewards", "terminations", "truncations"])
def test_a_parallel_env_needs_a_key_for_each_live_agent(drop):
    env = emulate(Parallel(drop))
    env.reset(seed=0)
    with pytest.raises(EmulationError, match=f"step\\(\\) returned {drop} without agent 'b', which was alive"):
        env.step(np.zeros(2, np.int64))


def test_a_missing_info_reads_as_empty_with_one_warning_per_env():
    # multigrid returns an empty defaultdict(dict) and PettingZoo's own API test only warns: nothing is lost
    env = emulate(Parallel("infos"))
    env.reset(seed=0)
    with pytest.warns(RuntimeWarning, match="returned infos without agent 'b', which was alive.*reads as {}"):
        infos = env.step(np.zeros(2, np.int64))[4]
    assert infos["b"] == {} and infos["a"] == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert env.step(np.zeros(2, np.int64))[4]["b"] == {}


def test_a_parallel_env_info_must_be_a_dict():
    env = emulate(Parallel(info_value=[1, 2]))
    env.reset(seed=0)
    with pytest.raises(EmulationError, match=r"\(agent 'b'\): step\(\) returned info=\[1, 2\] \(list\)"):
        env.step(np.zeros(2, np.int64))


def test_a_complete_parallel_step_is_stored():
    env = emulate(Parallel())
    env.reset(seed=0)
    _, rewards, terminals, truncations, _ = env.step(np.zeros(2, np.int64))
    assert rewards.tolist() == [1.0, 1.0] and not terminals.any() and not truncations.any()


# ---------------------------------------------------------------- packrl check files each under its heading


class NanReward(OldApi):
    def step(self, action):
        return self._obs(), float("nan"), False, False, {}


class BadFlag(OldApi):
    def step(self, action):
        return self._obs(), 0.0, [False], False, {}


@pytest.mark.parametrize("make, heading, text", [
    (lambda: NanReward("ok"), "rewards finite", "step returned reward=nan"),
    (lambda: BadFlag("ok"), "episode flags", "step returned terminated=[False]"),
    (lambda: OldApi("step4"), "reset and step return the API's values", "pre-0.26 gym API"),
    (lambda: OldApi("reset_obs_only"), "reset and step return the API's values", "pre-0.26 gym API"),
])
def test_check_files_a_refused_env_value_under_its_heading(make, heading, text):
    from packrl.check import check_env
    from packrl.models import Policy

    venv = vector.make(make, 2, backend="serial")
    try:
        report = check_env(venv, Policy.from_env(venv, hidden=8), steps=4)
    finally:
        venv.close()
    failed = [(c, d) for c, s, d in report.rows if s == "fail"]
    assert [c for c, _ in failed] == [heading], report.rows
    assert text in failed[0][1] and "env 0" in failed[0][1]
    assert report.results["sampled actions accepted by the env"][0] == "skip"


class OldTupleAgents(gym.Env):
    """Two agents in Tuple spaces, on the pre-0.26 gym API (reset returns the observation alone, step 4 values)."""

    observation_space = gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Discrete(3)))
    action_space = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(2)))

    def __init__(self, mode):
        self.mode = mode

    def reset(self, seed=None, options=None):
        return (0, 0) if self.mode == "reset" else ((0, 0), {})

    def step(self, action):
        return (1, 1), [0.0, 0.0], [False, False], {}


@pytest.mark.parametrize("mode, message", [("reset", r"reset\(\) returned info=0 \(int\); it must be a dict.*pre-0\.26 gym API"),
                                           ("step", r"step\(\) returned a tuple of 4 values.*pre-0\.26 gym API")])
def test_the_tuple_agents_adapter_names_the_old_api(mode, message):
    env = emulate(OldTupleAgents(mode), agents="tuple")
    with pytest.raises(EmulationError, match=message):
        env.reset(seed=0)
        env.step(np.zeros(2, np.int64))


@pytest.mark.parametrize("mode, message", [
    ("step4", r"step\(\) returned 4 values: this is the pre-0\.26 gym API.*found by gymnasium's gymnasium\.wrappers"),
    ("reset_obs_only", r"reset\(\) returned .*ndarray.*pre-0\.26 gym API"),
])
def test_an_old_api_env_inside_gymnasium_make_is_named(mode, message):
    """gymnasium.make wraps the env (TimeLimit unpacks its step): the wrapper's raw unpacking error is named."""
    gym.register("PackrlOldApi-v0", entry_point=OldApi, kwargs={"mode": mode}, max_episode_steps=50)
    try:
        env = emulate(gym.make("PackrlOldApi-v0", disable_env_checker=True))
        with pytest.raises(EmulationError, match=message):
            env.reset(seed=0)
            env.step(np.zeros(1, np.int64))
        venv = vector.make(lambda: gym.make("PackrlOldApi-v0", disable_env_checker=True), 2, backend="serial")
        try:
            with pytest.raises(EnvError, match=message):
                venv.reset(seed=0)
                venv.step(np.zeros(2, np.int64))
        finally:
            venv.close()
    finally:
        del gym.registry["PackrlOldApi-v0"]


def test_an_env_s_own_value_error_is_not_renamed():
    class Raises(OldApi):
        def step(self, action):
            a, b = (1, 2, 3)  # noqa: F841 - the env's own bug
            return super().step(action)

    env = emulate(Raises("ok"))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="too many values to unpack") as caught:
        env.step(np.zeros(1, np.int64))
    assert not isinstance(caught.value, EmulationError)
