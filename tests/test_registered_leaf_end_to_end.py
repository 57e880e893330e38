"""Leaf types packrl does not ship, registered here (in this test module, inside a fixture: nothing
registers them at import), one of one field and one of two, as observation and as action, end to
end: pack, pack_batch, the serial and multiprocessing (spawn) backends, a Numba env, nativize, the
default encoder, a PPO update and a checkpoint round trip. A script that registers in its main
block only runs the spawn backend too."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import njit
from pack_engines import ENGINES, use_engine

from packrl import EmulationError, EnvError, vector
from packrl.checkpoint import compare_layout, load_checkpoint, save_checkpoint
from packrl.emulation import ActionLayout, Layout, codecs, register_space
from packrl.emulation.codecs import Field, LeafCodec
from packrl.emulation.values import Bounds, format_path
from packrl.envs.numba_env import NumbaEnv
from packrl.models import Policy
from packrl.models.encoders import LayoutEncoder
from packrl.nativize import nativize
from packrl.train.ppo import PPO, PPOConfig
from packrl.vector.numba_backend import make_numba

RANKS, SUITS = "A23456789TJQK", "CDHS"


# ---------------------------------------------------------------- the two leaf types

class Clock(spaces.Space):
    """A time of day as an (hours, minutes) tuple."""

    def __init__(self, seed: int | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    def sample(self, mask=None, probability=None):
        return int(self.np_random.integers(24)), int(self.np_random.integers(60))

    def contains(self, x) -> bool:
        return isinstance(x, tuple) and len(x) == 2 and all(type(v) is int for v in x) \
            and 0 <= x[0] < 24 and 0 <= x[1] < 60

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __eq__(self, other) -> bool:
        return isinstance(other, Clock)


class ClockCodec(LeafCodec):
    """One field: minutes since midnight, int16 in [0, 1439] (its bounds on the codec)."""

    kind = "e2e_clock"

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
        return (np.asarray(hours * 60 + minutes, dtype=np.int16),)

    def to_native(self, unpacked):
        m = int(unpacked)
        return m // 60, m % 60


class Card(spaces.Space):
    """A playing card as a string: rank then suit ("QS", "TD")."""

    def __init__(self, seed: int | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    def sample(self, mask=None, probability=None):
        return RANKS[int(self.np_random.integers(13))] + SUITS[int(self.np_random.integers(4))]

    def contains(self, x) -> bool:
        return type(x) is str and len(x) == 2 and x[0] in RANKS and x[1] in SUITS

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __eq__(self, other) -> bool:
        return isinstance(other, Card)


class CardView(NamedTuple):
    rank: Any
    suit: Any


class CardCodec(LeafCodec):
    """Two fields of different dtypes, each with its own bounds: rank uint8 [0, 12], suit int16 [0, 3]."""

    kind = "e2e_card"

    def __init__(self, space: Card):
        self.space = space
        self.fields = (Field("rank", np.dtype(np.uint8), (), Bounds(0, 12, np.uint8, ())),
                       Field("suit", np.dtype(np.int16), (), Bounds(0, 3, np.int16, ())))

    def spec(self) -> dict:
        return {"kind": self.kind}

    @classmethod
    def from_spec(cls, spec: dict) -> "CardCodec":
        return cls(Card())

    def check(self, value, path, batch=()):
        cards = np.asarray(value, dtype=object) if batch else np.empty((), object)
        if not batch:
            cards[()] = value
        if cards.shape != batch:
            raise EmulationError(f"leaf {format_path(path)}: expected {batch} cards, got {value!r}")
        rank, suit = np.zeros(batch, np.uint8), np.zeros(batch, np.int16)
        for idx in np.ndindex(*batch):
            card = cards[idx]
            if not (isinstance(card, str) and len(card) == 2 and card[0] in RANKS and card[1] in SUITS):
                raise EmulationError(f"leaf {format_path(path)}: {card!r} is not a card")
            rank[idx], suit[idx] = RANKS.index(card[0]), SUITS.index(card[1])
        return rank, suit

    def view(self, arrays):
        return CardView(*arrays)

    def to_native(self, unpacked):
        return RANKS[int(unpacked.rank)] + SUITS[int(unpacked.suit)]


OBS = spaces.Dict({"clock": Clock(), "card": Card(), "light": spaces.Box(0.0, 1.0, (2,), np.float32)})
ACT = spaces.Dict({"clock": Clock(), "card": Card()})


@pytest.fixture(scope="module")
def registered():
    """Both leaf types registered in this process only (workers get them from it), then forgotten."""
    before = dict(codecs._BUILDERS)
    register_space(Clock, ClockCodec)
    register_space(Card, CardCodec)
    yield
    codecs._BUILDERS.clear()
    codecs._BUILDERS.update(before)


def native_reward(action: dict) -> float:
    """What the env pays for a native action: its minutes and its card, in one exact float."""
    h, m = action["clock"]
    card = action["card"]
    return float(h * 60 + m + 1440 * (RANKS.index(card[0]) * 4 + SUITS.index(card[1])))


def choice_reward(choices: np.ndarray) -> float:
    """The same from the policy's choices, in leaf order (gymnasium sorts Dict keys): card rank, card
    suit, clock minute."""
    return float(choices[2] + 1440 * (choices[0] * 4 + choices[1]))


class CardClockEnv(gym.Env):
    """Observes a clock, a card and a light; acts with a clock and a card, which it checks is native."""

    observation_space = OBS
    action_space = ACT

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = int(self.np_random.integers(24 * 60))
        return self._obs(), {}

    def _obs(self):
        return {"clock": (self.t // 60, self.t % 60), "card": RANKS[self.t % 13] + SUITS[self.t % 4],
                "light": np.array([0.5, 0.25], np.float32)}

    def step(self, action):
        if not self.action_space.contains(action):
            raise TypeError(f"the env received {action!r}, not a native action of its space")
        self.t = (self.t + 97) % (24 * 60)
        return self._obs(), native_reward(action), False, False, {}


def make_env():
    return gym.wrappers.TimeLimit(CardClockEnv(), max_episode_steps=16)


def sample_of(t: int, light: float = 0.5) -> dict:
    return {"clock": (t // 60, t % 60), "card": RANKS[t % 13] + SUITS[(t // 13) % 4],
            "light": np.array([light, 0.0], np.float32)}


# ---------------------------------------------------------------- pack, pack_batch, unpack

@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(times=st.lists(st.integers(0, 24 * 60 - 1), max_size=6))
def test_pack_batch_equals_pack_and_every_field_comes_back(registered, engine, monkeypatch, times):
    use_engine(engine, monkeypatch)
    layout = Layout.from_space(OBS)
    samples = [sample_of(t) for t in times]
    rows = layout.pack_batch(samples)
    assert rows.shape == (len(samples), layout.nbytes)
    assert rows.tobytes() == b"".join(layout.pack(s).tobytes() for s in samples)
    for row, s in zip(rows, samples):
        unpacked = layout.unpack(row)
        assert isinstance(unpacked["card"], CardView)
        assert (unpacked["card"].rank.dtype, unpacked["card"].suit.dtype) == (np.uint8, np.int16)
        native = layout.to_native(unpacked)
        assert native["clock"] == s["clock"] and native["card"] == s["card"]
    if samples:  # one batched structure too
        batched = {"clock": np.array([s["clock"] for s in samples]), "card": np.array([s["card"] for s in samples]),
                   "light": np.stack([s["light"] for s in samples])}
        assert layout.pack_batch(batched).tobytes() == rows.tobytes()


def test_refusals_name_the_leaf_and_the_sample(registered):
    layout = Layout.from_space(OBS)
    good = sample_of(100)
    with pytest.raises(EmulationError, match=r"leaf \['card'\]: 'ZS' is not a card"):
        layout.pack({**good, "card": "ZS"})
    with pytest.raises(EmulationError, match=r"sample 1: leaf \['card'\]: 'QX' is not a card"):
        layout.pack_batch([good, {**good, "card": "QX"}])
    with pytest.raises(EmulationError, match=r"sample 0: leaf \['clock'\]: \(24, 0\) is not a time of day"):
        layout.pack_batch([{**good, "clock": (24, 0)}])
    out = np.full((2, layout.nbytes), 7, np.uint8)
    with pytest.raises(EmulationError):
        layout.pack_batch([good, {**good, "card": 5}], out=out)
    assert (out == 7).all(), "a refused batch wrote into out"


def test_the_layout_names_and_bounds_each_field_and_round_trips_as_json(registered):
    layout = Layout.from_space(OBS)
    card = [leaf for leaf in layout.leaves if leaf.path == ("card",)]
    assert [leaf.name for leaf in card] == ["['card'].rank", "['card'].suit"]
    assert [(int(leaf.bounds.low), int(leaf.bounds.high)) for leaf in card] == [(0, 12), (0, 3)]
    assert Layout.from_json(layout.to_json()) == layout


def test_a_codec_of_two_unnamed_fields_is_refused(registered, monkeypatch):
    class Unnamed(CardCodec):
        kind = "e2e_unnamed"

        def __init__(self, space):
            super().__init__(space)
            self.fields = (Field(None, np.dtype(np.uint8), ()), Field(None, np.dtype(np.int16), ()))

    monkeypatch.setitem(codecs._BUILDERS, Card, Unnamed)
    with pytest.raises(EmulationError, match=r"leaf \['card'\]: codec .*Unnamed: a leaf of several fields names each"):
        Layout.from_space(OBS)


# ---------------------------------------------------------------- as actions

@settings(max_examples=40, deadline=None)
@given(choices=st.tuples(st.integers(0, 12), st.integers(0, 3), st.integers(0, 1439)))
def test_decode_gives_the_env_native_values_and_encode_inverts_it(registered, choices):
    action = ActionLayout(ACT)
    assert action.nvec.tolist() == [13, 4, 1440] and action.kind == "multidiscrete"
    policy_action = np.array(choices, np.int64)
    native = action.decode(policy_action)
    assert ACT.contains(native), native
    assert native_reward(native) == choice_reward(policy_action)
    assert action.encode(native).tolist() == list(choices)
    (batch_native,) = action.decode_batch(policy_action[None])
    assert batch_native == native


def test_an_action_outside_a_field_is_refused_by_name(registered):
    action = ActionLayout(ACT)
    with pytest.raises(EmulationError, match=r"\['card'\].*not a valid choice"):
        action.decode(np.array([0, 4, 0]))
    with pytest.raises(EmulationError, match=r"leaf \['card'\]: 'QQ' is not a card"):
        action.encode({"clock": (1, 2), "card": "QQ"})


# ---------------------------------------------------------------- vector backends

def run_backend(env, steps: int = 20) -> int:
    """Step with random policy actions: the env pays native_reward of what it received, which must be
    the decode of what was sent; every observation row reads back as a sample of OBS. Returns the rows checked."""
    layout = env.emulated.observation
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    nvec = env.emulated.action.nvec
    for _ in range(steps):
        actions = rng.integers(0, nvec, size=(env.num_envs, nvec.size))
        obs, rewards, *_ = env.step(actions)
        assert rewards.tolist() == [choice_reward(a) for a in actions]
        for row in obs:
            assert OBS.contains(layout.to_native(layout.unpack(row)))
    return steps * env.num_envs


def test_serial(registered):
    env = vector.make(make_env, 3, backend="serial", seed=0)
    try:
        assert run_backend(env) == 20 * env.num_envs
    finally:
        env.close()


def test_multiprocessing_spawn_workers_get_the_registration(registered):
    env = vector.make(make_env, 4, backend="multiprocessing", num_workers=2, seed=0, context="spawn")
    try:
        assert run_backend(env) == 20 * env.num_envs
    finally:
        env.close()


def test_ray_actors_get_the_registration(registered, ray_runtime):
    """Ray actors, like spawned workers, receive the driver's registered builders by import name. The builders'
    module must be importable there: this one is on pytest's path, handed to the actors through their
    runtime_env, as a user does for a module outside the workers' path."""
    import os
    from pathlib import Path

    path = os.pathsep.join([str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])])
    env = vector.make(make_env, 2, backend="ray", num_workers=2, seed=0,
                      actor_options={"runtime_env": {"env_vars": {"PYTHONPATH": path}}})
    try:
        assert run_backend(env) == 20 * env.num_envs
    finally:
        env.close()


MAIN_SCRIPT = '''
import numpy as np
from packrl import vector
from packrl.emulation import register_space
from {module} import Card, CardCodec, Clock, ClockCodec, make_env, choice_reward

def card_builder(space):  # defined at the top level of the main script: it reaches the workers
    return CardCodec(space)

if __name__ == "__main__":
    import sys
    register_space(Clock, ClockCodec)
    register_space(Card, card_builder if sys.argv[1] == "named" else (lambda space: CardCodec(space)))
    env = vector.make(make_env, 2, backend="multiprocessing", num_workers=2, seed=0, context="spawn")
    try:
        env.reset(seed=0)
        actions = np.array([[1, 2, 5], [12, 3, 1439]])
        _, rewards, *_ = env.step(actions)
        assert rewards.tolist() == [choice_reward(a) for a in actions], rewards
    finally:
        env.close()
    print("stepped")
'''


@pytest.mark.parametrize("builder", ["named", "lambda"])
def test_a_main_script_registering_in_its_main_block_only(tmp_path, builder):
    script = tmp_path / "train_cards.py"
    script.write_text(textwrap.dedent(MAIN_SCRIPT.format(module=__name__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(script), builder], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)  # quiet: the whole test takes 5 s
    if builder == "named":
        assert done.returncode == 0 and "stepped" in done.stdout, done.stderr[-3000:]
    else:
        assert done.returncode != 0
        assert "no packrl codec for space" in done.stderr and "Card" in done.stderr
        assert "did not reach this worker: it has no import name" in done.stderr, done.stderr[-3000:]
        assert "a class or function defined at the top level of a module" in done.stderr


def test_only_user_registrations_travel_and_a_layout_file_imports_nothing(registered):
    items, notes = codecs.registrations()  # other test modules may have left theirs
    names = {name for name, _ in items}
    assert {f"{__name__}.Card", f"{__name__}.Clock"} <= names and not any("Card" in note for note in notes)
    assert not names & {"gymnasium.spaces.box.Box", "gymnasium.spaces.text.Text", "minigrid.core.mission.MissionSpace"}
    doc = Layout.from_space(OBS).to_dict()
    doc["tree"]["dict"][0][1] = {"leaf": {"kind": "os.system"}}
    before = set(sys.modules)
    with pytest.raises(EmulationError, match="unknown codec kind 'os.system'"):
        Layout.from_dict(doc)
    assert set(sys.modules) == before


# ---------------------------------------------------------------- a Numba env

@njit
def numba_reset(state, obs, rng):
    obs.clock[0] = 0
    obs.card_rank[0] = 0
    obs.card_suit[0] = 0


@njit
def numba_step(state, action, obs, rng):
    obs.card_rank[0] = action[0]
    obs.card_suit[0] = action[1]
    obs.clock[0] = action[2]
    return float(action[2] + 1440 * (action[0] * 4 + action[1])), False, False


@njit
def numba_step_bad_suit(state, action, obs, rng):
    obs.card_suit[0] = 9
    return 0.0, False, False


NUMBA_OBS = spaces.Dict({"clock": Clock(), "card": Card()})


def test_a_numba_env_writes_both_fields_and_acts_with_them(registered):
    spec = NumbaEnv("cards", NUMBA_OBS, ACT, {"t": (1, np.int64)}, numba_reset, numba_step)
    env = make_numba(spec, 3, seed=0, threads=1)
    layout, action = env.emulated.observation, env.emulated.action
    env.reset(seed=0)
    choices = np.array([[1, 2, 5], [12, 3, 1439], [0, 0, 0]], np.int64)
    obs, rewards, *_ = env.step(choices)
    assert rewards.tolist() == [choice_reward(c) for c in choices]
    for row, c in zip(obs, choices):
        native = layout.to_native(layout.unpack(row))
        assert native == action.decode(c)


def test_a_numba_env_writing_outside_a_field_names_it(registered):
    spec = NumbaEnv("bad_cards", NUMBA_OBS, ACT, {"t": (1, np.int64)}, numba_reset, numba_step_bad_suit)
    env = make_numba(spec, 2, seed=0, threads=1)
    env.reset(seed=0)
    with pytest.raises(EnvError, match=r"\['card'\]\.suit"):
        env.step(np.zeros((2, 3), np.int64))


# ---------------------------------------------------------------- nativize, encoder, PPO, checkpoint

def test_nativize_gives_every_field_with_its_dtype(registered):
    layout = Layout.from_space(OBS)
    rows = torch.from_numpy(layout.pack_batch([sample_of(0), sample_of(1439), sample_of(777)]))
    tree = nativize(rows, layout)
    assert isinstance(tree["card"], CardView)
    assert tree["card"].rank.dtype == torch.uint8 and tree["card"].suit.dtype == torch.int16
    expected = [layout.to_native(layout.unpack(r.numpy()))["card"] for r in rows]
    assert [RANKS[int(r)] + SUITS[int(s)] for r, s in zip(*tree["card"])] == expected
    assert tree["clock"].tolist() == [0, 1439, 777]


def test_the_default_encoder_reads_every_field(registered):
    layout = Layout.from_space(OBS)
    torch.manual_seed(0)
    encoder = LayoutEncoder(layout, hidden=16)
    base = sample_of(0)
    variants = {"clock": {**base, "clock": (5, 7)}, "card rank": {**base, "card": "K" + base["card"][1]},
                "card suit": {**base, "card": base["card"][0] + "S"}}
    rows = torch.from_numpy(layout.pack_batch([base, *variants.values()]))
    with torch.no_grad():
        features = encoder(rows)
    for k, name in enumerate(variants, start=1):
        assert not torch.equal(features[k], features[0]), f"changing only the {name} left the features unchanged"


def test_a_ppo_update_and_a_checkpoint_round_trip(registered, tmp_path):
    env = vector.make(make_env, 2, seed=0)
    try:
        torch.manual_seed(0)
        policy = Policy.from_env(env, hidden=8)
        before = [p.detach().clone() for p in policy.parameters()]
        ppo = PPO(env, policy, PPOConfig(num_steps=8, num_minibatches=1, update_epochs=1, seed=0))
        ppo.collect()
        stats = ppo.update()
        assert all(np.isfinite(float(v)) for v in stats.values() if np.ndim(v) == 0)
        assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters())), "the update changed no weight"
        layouts = {"observation": env.emulated.observation, "action": env.emulated.action.layout}
        save_checkpoint(tmp_path / "ckpt", policy.state_dict(), config={"hidden": 8}, layouts=layouts)
        state, metadata, _ = load_checkpoint(tmp_path / "ckpt")
        for name, layout in layouts.items():
            assert Layout.from_dict(metadata["layouts"][name]) == layout
            compare_layout(metadata["layouts"][name], layout.to_dict(), name, tmp_path)
        loaded = Policy.from_env(env, hidden=8)
        loaded.load_state_dict(state)
        rows = torch.from_numpy(env.emulated.observation.pack_batch([sample_of(3), sample_of(900)]))
        with torch.no_grad():
            a = policy.forward_eval(rows, policy.initial_state(2, "cpu"))
            b = loaded.forward_eval(rows, loaded.initial_state(2, "cpu"))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    finally:
        env.close()
