"""A leaf type packrl does not ship, taught through ``register_space``, works end to end: pack
(checked and compiled), JSON, nativize, the encoder, ``packrl check``'s bounds, the Numba envs'
bounds, and a PPO update on an env that emits it. Everything reads the codec's capabilities
(bounds, categorical, is_string), never a kind string."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from numba import njit
from pack_engines import use_engine

from packrl import EmulationError, vector
from packrl.check import _outside
from packrl.emulation import Layout, register_space
from packrl.emulation.codecs import Field, LeafCodec
from packrl.emulation.values import Bounds, format_path
from packrl.envs.numba_env import NumbaEnv, leaf_checks
from packrl.models import Policy
from packrl.models.encoders import Flat, LayoutEncoder, build_leaf_encoder, default_choice
from packrl.nativize import nativize
from packrl.train.ppo import PPO, PPOConfig


class Clock(spaces.Space):
    """A time of day as an (hours, minutes) tuple."""

    def __init__(self, seed: int | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    def sample(self, mask=None, probability=None):
        return int(self.np_random.integers(24)), int(self.np_random.integers(60))

    def contains(self, x) -> bool:
        return isinstance(x, tuple) and len(x) == 2 and 0 <= x[0] < 24 and 0 <= x[1] < 60

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __eq__(self, other) -> bool:
        return isinstance(other, Clock)


class ClockCodec(LeafCodec):
    """Minutes since midnight, one int16 in [0, 1439]; its check converts (hours, minutes)."""

    kind = "test_clock"

    def __init__(self, space: Clock):
        self.space = space
        self.fields = (Field(None, np.dtype(np.int16), ()),)
        self.bounds = Bounds(0, 24 * 60 - 1, np.int16, ())

    def spec(self) -> dict:
        return {"kind": self.kind}

    @classmethod
    def from_spec(cls, spec: dict) -> "ClockCodec":
        return cls(Clock())

    def check(self, value, path, batch=()):
        hm = np.asarray(value)
        if hm.shape != batch + (2,) or hm.dtype.kind not in "iu":
            raise EmulationError(f"leaf {format_path(path)}: expected (hours, minutes) integers, got {value!r}")
        hours, minutes = hm[..., 0].astype(np.int64), hm[..., 1].astype(np.int64)
        if np.any((hours < 0) | (hours > 23) | (minutes < 0) | (minutes > 59)):
            raise EmulationError(f"leaf {format_path(path)}: {value!r} is not a time of day")
        return (np.asarray(hours * 60 + minutes, dtype=np.int16),)  # an array, as check promises (not a scalar)

    def to_native(self, unpacked):
        m = int(unpacked)
        return m // 60, m % 60


register_space(Clock, ClockCodec)
SPACE = spaces.Dict({"clock": Clock(), "light": spaces.Box(0.0, 1.0, (2,), np.float32)})


def sample(h: int = 12, m: int = 30) -> dict:
    return {"clock": (h, m), "light": np.array([0.25, 0.5], np.float32)}


def test_it_packs_unpacks_and_refuses_by_its_own_check(monkeypatch):
    use_engine("python", monkeypatch)
    layout = Layout.from_space(SPACE)
    leaf = next(leaf for leaf in layout.leaves if leaf.path == ("clock",))
    assert leaf.dtype == np.int16 and leaf.bounds.low[()] == 0 and leaf.bounds.high[()] == 1439
    row = layout.pack(sample())
    assert int(layout.unpack(row)["clock"]) == 750
    assert layout.to_native(layout.unpack(row))["clock"] == (12, 30)
    with pytest.raises(EmulationError, match=r"leaf \['clock'\]: \(24, 0\) is not a time of day"):
        layout.pack(sample(24, 0))
    rows = layout.pack_batch([sample(0, 0), sample(23, 59)])
    assert layout.unpack(rows)["clock"].tolist() == [0, 1439]
    assert Layout.from_json(layout.to_json()) == layout


def test_the_compiled_pack_takes_it_and_leaves_refusals_to_its_check():
    layout = Layout.from_space(SPACE)
    compiled = layout.compiled_pack()
    assert compiled is not None
    rows = np.zeros((2, layout.nbytes), np.uint8)
    assert compiled.pack(sample(7, 5), rows, 0) is True
    expected = np.zeros(layout.nbytes, np.uint8)
    layout.bind(expected).pack_checked(sample(7, 5))
    assert rows[0].tobytes() == expected.tobytes()
    assert compiled.pack(sample(7, 60), rows, 1) is False and not rows[1].any()


def test_nativize_and_the_encoder_read_its_bounds():
    layout = Layout.from_space(SPACE)
    rows = torch.from_numpy(layout.pack_batch([sample(0, 0), sample(23, 59), sample(12, 0)]))
    tree = nativize(rows, layout)
    assert tree["clock"].dtype == torch.int16 and tree["clock"].tolist() == [0, 1439, 720]
    leaf = next(leaf for leaf in layout.leaves if leaf.path == ("clock",))
    assert default_choice(leaf) == "flat"
    flat = build_leaf_encoder(leaf, "flat")
    assert isinstance(flat, Flat)
    assert flat(tree["clock"]).reshape(-1).tolist() == pytest.approx([-1.0, 1.0, 720 / 719.5 - 1], abs=1e-6)
    assert build_leaf_encoder(leaf, "embedding").table.num_embeddings == 1440  # integer bounds: embeddable
    features = LayoutEncoder(layout, hidden=8)(rows)
    assert features.shape == (3, 8) and torch.isfinite(features).all()


def test_check_and_the_numba_envs_take_its_bounds():
    layout = Layout.from_space(SPACE)
    leaf = next(leaf for leaf in layout.leaves if leaf.path == ("clock",))
    first, why, rows = _outside(leaf, np.array([5, 1440, 3], np.int16))
    assert first == 1 and "[0, 1439]" in why and rows.tolist() == [False, True, False]
    assert _outside(leaf, np.array([0, 1439], np.int16)) is None

    @njit
    def reset(state, obs, rng):
        obs.clock[0] = 0

    @njit
    def step(state, action, obs, rng):
        return 0.0, False, False

    env = NumbaEnv("clock", spaces.Dict({"clock": Clock()}), spaces.Discrete(2), {"t": (1, np.int64)}, reset, step)
    (check,) = leaf_checks(env, Layout.from_space(env.observation_space))
    assert check.kind == "range" and check.low.tolist() == [0] and check.high.tolist() == [1439]


class ClockEnv(gym.Env):
    """Reward 1 for action 1 in the afternoon, for action 0 otherwise."""

    observation_space = SPACE
    action_space = spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = int(self.np_random.integers(24 * 60))
        return self._obs(), {}

    def _obs(self):
        return {"clock": (self.t // 60, self.t % 60), "light": np.array([0.5, 0.5], np.float32)}

    def step(self, action):
        reward = float(int(action) == int(self.t >= 12 * 60))
        self.t = (self.t + 97) % (24 * 60)
        return self._obs(), reward, False, False, {}


def test_a_ppo_update_trains_on_it():
    env = vector.make(lambda: gym.wrappers.TimeLimit(ClockEnv(), max_episode_steps=16), 2, seed=0)
    torch.manual_seed(0)
    policy = Policy.from_env(env, hidden=8)
    before = [p.detach().clone() for p in policy.parameters()]
    ppo = PPO(env, policy, PPOConfig(num_steps=8, num_minibatches=1, update_epochs=1, seed=0))
    ppo.collect()
    stats = ppo.update()
    assert all(np.isfinite(float(v)) for v in stats.values() if np.ndim(v) == 0)
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters())), "the update changed no weight"
    env.close()
