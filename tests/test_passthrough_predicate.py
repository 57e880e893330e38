"""Box pass-through is decided once (``Layout.box``): the emulation's rows, nativize, the encoder,
SB3's view and ``packrl check`` all read that one predicate, so they agree on every space."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from packrl.emulation import Layout, emulate
from packrl.models.encoders import LayoutEncoder
from packrl.nativize import nativize

SPACES = {
    "float Box": (spaces.Box(-1.0, 1.0, (3,), np.float32), True),
    "0-d uint8 Box": (spaces.Box(0, 9, (), np.uint8), True),
    "bool Box": (spaces.Box(0, 1, (2, 2), np.bool_), True),
    "Discrete": (spaces.Discrete(4), False),
    "MultiBinary": (spaces.MultiBinary(3), False),
    "Dict of one Box": (spaces.Dict({"x": spaces.Box(-1.0, 1.0, (3,), np.float32)}), False),
    "Tuple of one Box": (spaces.Tuple((spaces.Box(-1.0, 1.0, (3,), np.float32),)), False),
}


class _Env(gym.Env):
    def __init__(self, space: spaces.Space):
        self.observation_space, self.action_space = space, spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


@pytest.mark.parametrize("name", list(SPACES))
def test_every_reader_agrees_with_layout_box(name):
    space, lone_box = SPACES[name]
    space.seed(0)
    layout = Layout.from_space(space)
    assert (layout.box is not None) == lone_box
    if lone_box:
        assert layout.box is layout.leaves[0] and layout.box.path == ()
    env = emulate(_Env(space))
    obs, _ = env.reset(seed=0)
    assert env.passthrough == lone_box
    if lone_box:
        assert obs.dtype == layout.box.dtype and obs.shape == (1, *layout.box.shape)
    else:
        assert obs.dtype == np.uint8 and obs.shape == (1, layout.nbytes)
    assert LayoutEncoder(env.emulated.observation, 8).passthrough_leaf == layout.box
    # the Box's own rows come back from nativize as they are (uint8 rows as wide as nbytes read as packed
    # rows, as nativize documents: the readings differ only for a 0-d uint8 Box)
    if lone_box and not (obs.dtype == np.uint8 and obs.shape[-1] == layout.nbytes):
        assert nativize(obs, layout) is obs
        rows = torch.from_numpy(obs)
        assert nativize(rows, layout) is rows


def test_a_layout_read_back_from_json_keeps_the_predicate():
    for space, lone_box in SPACES.values():
        again = Layout.from_json(Layout.from_space(space).to_json())
        assert (again.box is not None) == lone_box
