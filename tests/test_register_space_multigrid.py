"""multigrid's MissionSpace (a MultiDiscrete of nvec (1,) whose samples have shape ()): the
refusal stays clear and names the fix, and the fix (a codec registered for that class, as the
README shows it) packs the real env's observations, on every pack path."""
from __future__ import annotations

import pickle

import gymnasium as gym
import multigrid.envs  # noqa: F401  (registers MultiGrid-*)
import numpy as np
import pytest
from gymnasium import spaces
from multigrid.core.mission import MissionSpace
from pack_engines import ENGINES, use_engine

from packrl import EmulationError
from packrl.emulation import Layout, codecs, register_space
from packrl.emulation.codecs import MultiDiscreteCodec


# ---- the README's example, word for word
class MissionCodec(MultiDiscreteCodec):
    """multigrid's MissionSpace: a MultiDiscrete whose samples have shape () when nvec is (1,)."""

    stores_input = False  # a sample is not stored as it is: it gains the (1,) axis

    def check(self, value, path, batch=()):
        value = np.asarray(value)
        if self.shape == (1,) and value.shape == batch:
            value = value[..., None]
        return super().check(value, path, batch)
# ----


@pytest.fixture
def registered():
    before = dict(codecs._BUILDERS)
    register_space(MissionSpace, MissionCodec)
    yield
    codecs._BUILDERS.clear()
    codecs._BUILDERS.update(before)


def observations(steps=12):
    env = gym.make("MultiGrid-Empty-8x8-v0", agents=1)
    obs, _ = env.reset(seed=0)
    out = [obs[0]]
    rng = np.random.default_rng(0)
    for _ in range(steps):
        obs, *_ = env.step({0: int(rng.integers(3))})
        out.append(obs[0])
    return env.observation_space[0], out


def test_the_refusal_names_the_space_and_the_fix():
    space, obs = observations(0)
    layout = Layout.from_space(space)
    with pytest.raises(EmulationError) as info:
        layout.pack(obs[0])
    text = str(info.value)
    assert "leaf ['mission']: shape () does not match the space's (1,)" in text  # the refusal, as clear as before
    assert "multigrid.core.mission.MissionSpace" in text and "register_space(MissionSpace, builder)" in text


@pytest.mark.parametrize("engine", ENGINES)
def test_a_codec_registered_for_the_class_packs_the_real_observations(registered, engine, monkeypatch):
    use_engine(engine, monkeypatch)
    space, obs = observations()
    layout = Layout.from_space(space)
    rows = np.stack([layout.pack(o) for o in obs])
    assert np.array_equal(layout.pack_batch(obs), rows)
    for row, o in zip(rows, obs):
        unpacked = layout.unpack(row)
        assert np.array_equal(unpacked["image"], o["image"]) and unpacked["direction"] == o["direction"]
        assert unpacked["mission"].tolist() == [0]
    with pytest.raises(EmulationError, match=r"\['mission'\]"):
        layout.pack({**obs[0], "mission": np.array(1)})  # index 1 is outside nvec (1,)


class Wider(spaces.MultiDiscrete):
    """A MultiDiscrete subclass with nothing registered for it."""


def test_the_hint_survives_pickling():
    layout = pickle.loads(pickle.dumps(Layout.from_space(Wider([3]))))
    with pytest.raises(EmulationError, match=r"shape \(\) does not match.*register_space\(Wider, builder\)"):
        layout.pack(np.int64(1))
    assert Layout.from_space(spaces.MultiDiscrete([3])).root.codec.subclass_hint == ""
