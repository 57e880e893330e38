"""Single-agent emulate on real gymnasium envs: every leaf equals the raw env's, step by step."""
from __future__ import annotations

import gymnasium as gym
import minigrid  # noqa: F401  (registers the MiniGrid envs)
import numpy as np
import pytest
import torch
from gymnasium import spaces

from packrl import EmulationError
from packrl.emulation import ActionLayout, emulate
from packrl.nativize import nativize


def equal_leaves(native, raw):
    if isinstance(raw, dict):
        assert set(native) == set(raw)
        for k in raw:
            equal_leaves(native[k], raw[k])
    elif isinstance(raw, tuple):
        assert type(native) is tuple and len(native) == len(raw)
        for n, r in zip(native, raw):
            equal_leaves(n, r)
    elif isinstance(raw, str):
        assert native == raw
    else:
        raw = np.asarray(raw)
        assert np.asarray(native).shape == raw.shape
        assert np.array_equal(native, raw)


def play_side_by_side(env_id, steps, seed=7, **kwargs):
    raw = gym.make(env_id, **kwargs)
    env = emulate(gym.make(env_id, **kwargs))
    layout = env.emulated.observation
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    raw_obs, _ = raw.reset(seed=seed)
    equal_leaves(layout.to_native(layout.unpack(obs[0])), raw_obs)
    ends = 0
    for t in range(steps):
        action = int(rng.integers(raw.action_space.n))
        obs, rewards, terminals, truncations, _ = env.step(np.array([action]))
        raw_obs, reward, terminated, truncated, _ = raw.step(action + int(raw.action_space.start))
        equal_leaves(layout.to_native(layout.unpack(obs[0])), raw_obs)
        assert rewards[0] == np.float32(reward) and terminals[0] == terminated and truncations[0] == truncated
        if terminated or truncated:
            equal_leaves(layout.to_native(layout.unpack(env.final_observations[0])), raw_obs)
            ends += 1
            obs, _ = env.reset(seed=seed + t)
            raw_obs, _ = raw.reset(seed=seed + t)
            equal_leaves(layout.to_native(layout.unpack(obs[0])), raw_obs)
    return env, ends


def test_minigrid_dict_with_mission_string():
    env, ends = play_side_by_side("MiniGrid-DoorKey-5x5-v0", 300)
    leaves = {leaf.name: leaf for leaf in env.emulated.observation.leaves}
    assert leaves["['image']"].dtype == np.uint8 and leaves["['image']"].shape == (7, 7, 3)
    assert leaves["['mission'].chars"].kind == "bounded_string"
    assert ends >= 1


def test_babyai_long_missions_fit_the_default_bound():
    env, _ = play_side_by_side("BabyAI-GoToLocal-v0", 40)
    assert env.emulated.observation.nbytes >= 256


def test_out_of_range_discrete_action_names_the_agent():
    env = emulate(gym.make("FrozenLake-v1"))
    env.reset(seed=0)
    with pytest.raises(EmulationError, match="agent_0"):
        env.step(np.array([4]))


def test_blackjack_tuple_of_discrete():
    env, ends = play_side_by_side("Blackjack-v1", 200)
    kinds = [leaf.kind for leaf in env.emulated.observation.leaves]
    assert kinds == ["discrete", "discrete", "discrete"] and ends >= 10
    assert all(leaf.dtype == np.int64 for leaf in env.emulated.observation.leaves)


def test_frozenlake_bare_discrete():
    env, ends = play_side_by_side("FrozenLake-v1", 200)
    assert env.single_observation_space.dtype == np.uint8
    assert env.single_observation_space.shape == (8,)
    assert ends >= 5


def test_plain_box_observation_passes_through():
    env = emulate(gym.make("CartPole-v1"))
    raw = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=1)
    raw_obs, _ = raw.reset(seed=1)
    assert env.single_observation_space == raw.observation_space
    assert obs.dtype == np.float32 and obs.shape == (1, 4)
    assert np.array_equal(obs[0], raw_obs)
    obs, *_ = env.step(np.array([1]))
    assert np.array_equal(obs[0], raw.step(1)[0])


def test_minigrid_rows_nativize_in_torch():
    env = emulate(gym.make("MiniGrid-Empty-5x5-v0"))
    raw = gym.make("MiniGrid-Empty-5x5-v0")
    obs, _ = env.reset(seed=0)
    raw_obs, _ = raw.reset(seed=0)
    views = nativize(torch.from_numpy(obs), env.emulated.observation)
    assert views["image"].shape == (1, 7, 7, 3) and views["image"].dtype == torch.uint8
    assert np.array_equal(views["image"][0].numpy(), raw_obs["image"])
    assert views["direction"].tolist() == [raw_obs["direction"]]


class HybridEnv(gym.Env):
    """Echoes its structured action back as the observation, so the test sees what the env received."""

    def __init__(self):
        self.action_space = spaces.Dict({
            "move": spaces.Discrete(3, start=-1),
            "fire": spaces.MultiBinary(2),
            "aim": spaces.Box(np.array([-1.0, 0.0]), np.array([1.0, 10.0]), dtype=np.float64),
            "gear": spaces.Tuple((spaces.MultiDiscrete([2, 4], start=[1, 1]), spaces.Box(-2, 2, (1,), np.float16))),
        })
        self.observation_space = self.action_space
        self.received = None

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self.action_space.sample(), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.received = action
        return action, 0.0, False, False, {}


def test_hybrid_actions_reach_the_env_in_native_form():
    env = emulate(HybridEnv())
    act = env.emulated.action
    assert act.kind == "hybrid" and act.nvec.tolist() == [2, 2, 2, 4, 3]
    env.reset(seed=0)
    policy_action = {"discrete": np.array([[1, 0, 0, 3, 0]]), "continuous": np.array([[0.5, 7.0, -2.0]], np.float64)}
    env.step(policy_action)
    got = env.env.received
    assert got["move"] == -1 and got["fire"].tolist() == [1, 0] and got["gear"][0].tolist() == [1, 4]
    assert got["aim"].dtype == np.float64 and got["aim"].tolist() == [0.5, 7.0]
    assert got["gear"][1].dtype == np.float16
    native = env.emulated.observation.to_native(env.emulated.observation.unpack(env.observations[0]))
    assert native["move"] == -1


def test_hybrid_bad_actions_are_refused():
    env = emulate(HybridEnv())
    env.reset(seed=0)
    with pytest.raises(EmulationError, match=r"\['move'\]"):
        env.step({"discrete": np.array([[1, 0, 0, 3, 3]]), "continuous": np.zeros((1, 3))})
    with pytest.raises(EmulationError, match=r"\['aim'\]"):
        env.step({"discrete": np.array([[1, 0, 0, 3, 0]]), "continuous": np.array([[0.0, 11.0, 0.0]])})
    with pytest.raises(EmulationError, match="4 values, the space needs 3"):
        env.step({"discrete": np.array([[1, 0, 0, 3, 0]]), "continuous": np.zeros((1, 4))})


def test_observation_outside_the_space_is_refused_on_every_step():
    class Drifting(gym.Env):
        observation_space = spaces.Dict({"hp": spaces.Box(0, 100, (), np.int16)})
        action_space = spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            self.hp = 98
            return {"hp": np.int16(self.hp)}, {}

        def step(self, action):
            self.hp += 1
            return {"hp": np.int16(self.hp)}, 0.0, False, False, {}

    env = emulate(Drifting())
    env.reset()
    env.step(0)
    env.step(0)
    with pytest.raises(EmulationError, match=r"\['hp'\].*101"):
        env.step(0)


@pytest.mark.parametrize("space", [
    spaces.Discrete(7, start=-3),
    spaces.MultiDiscrete([[2, 3], [4, 5]], start=[[1, 1], [-1, 0]]),
    spaces.MultiBinary(4),
    spaces.Box(-1, 3, (2, 2), np.float32),
    spaces.Box(-3, 3, (2,), np.int8),
    spaces.Dict({"a": spaces.Discrete(3, start=5), "b": spaces.Tuple((spaces.Box(-1, 1, (2,), np.float64), spaces.MultiBinary(2)))}),
])
def test_action_encode_decode_are_exact_inverses(space):
    act = ActionLayout(space)
    space.seed(0)
    for _ in range(50):
        native = space.sample()
        assert act.layout.pack(act.decode(act.encode(native))).tobytes() == act.layout.pack(native).tobytes()
        assert act.policy_space.contains(act.encode(native))


def test_uint64_actions_beyond_int64_decode_and_encode_exactly():
    space = spaces.Dict({
        "m": spaces.MultiDiscrete(np.array([3, 4], np.uint64), dtype=np.uint64,
                                  start=np.array([2**64 - 10, 5], np.uint64)),
        "b": spaces.Box(2**64 - 5, 2**64 - 1, (2,), np.uint64),
        "d": spaces.Discrete(5, start=2**64 - 5, dtype=np.uint64),
    })
    act = ActionLayout(space)
    native = {"m": np.array([2**64 - 8, 8], np.uint64), "b": np.array([2**64 - 5, 2**64 - 1], np.uint64),
              "d": np.uint64(2**64 - 1)}
    policy = act.encode(native)
    assert policy.tolist() == [0, 4, 4, 2, 3]  # gymnasium sorts the keys: b, d, m
    back = act.decode(policy)
    assert act.layout.pack(back).tobytes() == act.layout.pack(native).tobytes()
    assert back["m"].dtype == back["b"].dtype == np.uint64 and int(back["d"]) == 2**64 - 1
    single = ActionLayout(spaces.Discrete(5, start=2**64 - 5, dtype=np.uint64))
    assert [int(v) for v in single.decode_choices(np.array([0, 4]))] == [2**64 - 5, 2**64 - 1]


def test_action_with_huge_integer_box_is_refused():
    with pytest.raises(EmulationError, match=r"\['x'\]"):
        ActionLayout(spaces.Dict({"x": spaces.Box(0, 2**40, (1,), np.int64)}))
