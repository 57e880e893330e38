"""The action decode for every action kind: the C decoder (``_fastaction``) against the checked Python
path, one action and a batch at a time, and through ``emulate`` and the vector backends.

Every case is differential: the C decoder either gives exactly what the Python path gives (the same
structure, leaf types, dtypes and bytes) or takes nothing (None), and a refused action gets the
Python path's message whichever path saw it first."""
from __future__ import annotations

import pickle

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from packrl import EmulationError, vector
from packrl.emulation import (
    _fastaction,  # a failed build must fail here, not be skipped
    emulate,
)
from packrl.emulation.actions import ActionLayout, fast_decode

INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
shapes = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)


@st.composite
def int_boxes(draw):
    dtype = np.dtype(draw(st.sampled_from(INT_DTYPES)))
    info = np.iinfo(dtype)
    low = draw(st.sampled_from([int(info.min), int(info.max) - 5, 0]))
    return spaces.Box(low, low + draw(st.integers(0, 5)), draw(shapes), dtype)


@st.composite
def float_boxes(draw):
    dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
    if draw(st.booleans()):
        return spaces.Box(-np.inf, np.inf, draw(shapes), dtype)
    low = draw(st.floats(-100, 100, width=16))
    return spaces.Box(low, low + draw(st.floats(0, 100, width=16)), draw(shapes), dtype)


@st.composite
def discretes(draw):
    dtype = draw(st.sampled_from([np.int64, np.int32, np.uint64]))
    n = draw(st.integers(1, 9))
    info = np.iinfo(dtype)
    start = draw(st.sampled_from([0, int(info.min), int(info.max) - n + 1, -3 if info.min < 0 else 3]))
    return spaces.Discrete(n, start=start, dtype=dtype)


@st.composite
def multi_discretes(draw):
    shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple))
    dtype = np.dtype(draw(st.sampled_from([np.int64, np.int8, np.uint32, np.uint64])))
    size = int(np.prod(shape))
    nvec = np.array(draw(st.lists(st.integers(1, 5), min_size=size, max_size=size)), dtype).reshape(shape)
    low = 0 if dtype.kind == "u" else -3
    start = np.array(draw(st.lists(st.integers(low, 3), min_size=size, max_size=size)), dtype).reshape(shape)
    return spaces.MultiDiscrete(nvec, start=start, dtype=dtype)


leaves = st.one_of(discretes(), multi_discretes(), shapes.map(lambda s: spaces.MultiBinary(list(s or (2,)))),
                   int_boxes(), float_boxes(), shapes.map(lambda s: spaces.Box(0, 1, s, bool)))
action_spaces = st.recursive(leaves, lambda children: st.one_of(
    st.dictionaries(st.text("abc", min_size=1, max_size=2), children, min_size=1, max_size=3).map(spaces.Dict),
    st.lists(children, min_size=1, max_size=3).map(spaces.Tuple)), max_leaves=5)


@st.composite
def layouts_and_batches(draw, rows: int | None = None):
    """An action layout and a batch of policy actions for it (choices and values in range, at the
    bounds, or just outside, NaN and inf among them), as int64 and float32 or float64 arrays."""
    act = ActionLayout(draw(action_spaces))
    rows = draw(st.integers(1, 4)) if rows is None else rows
    choice = st.integers(-1, int(act.nvec.max()) if act.num_discrete else 1)
    disc = draw(hnp.arrays(np.int64, (rows, act.num_discrete), elements=choice))
    disc = np.minimum(disc, act.nvec) if draw(st.booleans()) else np.minimum(disc, act.nvec - 1)  # mostly inside
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    cont = draw(hnp.arrays(dtype, (rows, act.num_continuous), elements=st.floats(width=32)))
    for k in range(act.num_continuous):  # some values at their bounds
        if draw(st.booleans()) and np.isfinite(act.low[k]):
            cont[:, k] = dtype(act.low[k]) if np.float64(dtype(act.low[k])) >= act.low[k] else act.high[k]
    return act, disc, cont


def policy_batch(act: ActionLayout, disc: np.ndarray, cont: np.ndarray):
    """The batch in the layout's policy form (a leading rows axis)."""
    if act.kind == "hybrid":
        return {"discrete": disc, "continuous": cont}
    if act.kind == "continuous":
        return cont.reshape(len(cont), *act.policy_space.shape)
    return disc[:, 0].copy() if act.kind == "discrete" else disc


def row_of(batch, k: int):
    return {name: part[k] for name, part in batch.items()} if isinstance(batch, dict) else batch[k]


def python_decode(act: ActionLayout, action, who: str = ""):
    """(native, None) or (None, the refusal's message) on the Python path."""
    try:
        return act.checked_decode(action, who), None
    except EmulationError as err:
        return None, str(err)


def assert_same_native(got, expected, where=()):
    """Equal structure, leaf types, dtypes, shapes and bytes."""
    assert type(got) is type(expected), (where, type(got), type(expected))
    if isinstance(expected, dict):
        assert list(got) == list(expected), where
        for key in expected:
            assert_same_native(got[key], expected[key], where + (key,))
    elif isinstance(expected, tuple):
        assert len(got) == len(expected), where
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_same_native(g, e, where + (i,))
    else:
        assert got.dtype == expected.dtype and np.shape(got) == np.shape(expected), (where, got, expected)
        assert np.asarray(got).tobytes() == np.asarray(expected).tobytes(), (where, got, expected)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts_and_batches(rows=1))
def test_c_decode_of_one_action_equals_the_python_path_or_takes_nothing(case):
    act, disc, cont = case
    action = row_of(policy_batch(act, disc, cont), 0)
    expected, refusal = python_decode(act, action, " (agent x)")
    got = fast_decode(act.spec, action)
    if act.spec is not None and refusal is None:  # C takes every int64 and float32/64 action inside the space
        assert got is not None, (act, action)
    if refusal is not None:
        assert got is None, (act, action, refusal)
        with pytest.raises(EmulationError) as err:
            act.decode(action, " (agent x)")
        assert str(err.value) == refusal
    else:
        if got is not None:
            assert_same_native(got, expected)
        assert_same_native(act.decode(action, " (agent x)"), expected)
        assert act.space.contains(act.decode(action)), (act.space, action)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts_and_batches())
def test_batch_decode_and_check_equal_row_by_row_decode(case):
    act, disc, cont = case
    batch = policy_batch(act, disc, cont)
    rows = [python_decode(act, row_of(batch, k), f" (env {k})") for k in range(len(disc))]
    first_bad = next((k for k, (_, refusal) in enumerate(rows) if refusal is not None), -1)
    assert act.check_batch(disc, cont) == first_bad
    spec, act.spec = act.spec, None  # the NumPy checker gives the same row
    try:
        assert act.check_batch(disc, cont) == first_bad
    finally:
        act.spec = spec
    if first_bad >= 0:
        with pytest.raises(EmulationError) as err:
            act.decode_batch(batch, " (env {})")
        assert str(err.value) == rows[first_bad][1]
    else:
        for got, (expected, _) in zip(act.decode_batch(batch, " (env {})"), rows):
            assert_same_native(got, expected)


# the forms a Discrete action arrives in, C or not (what the former C ``choice`` lookup was tested with)
def small_arrays(dtype):
    dtype = np.dtype(dtype)
    elements = st.booleans() if dtype.kind == "b" else st.integers(0 if dtype.kind == "u" else -3, 12)
    return hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=2, max_side=2), elements=elements)


discrete_actions = st.one_of(
    st.sampled_from([np.int64, np.int32, np.uint64, np.float64, np.bool_, ">i8", np.longlong]).flatmap(small_arrays),
    st.integers(-2**70, 2**70), st.integers(-3, 12), st.booleans(), st.floats(-3, 12),
    st.integers(-3, 12).map(np.int64), st.integers(-3, 12).map(np.int32), st.integers(-3, 12).map(np.longlong),
    st.none(), st.text(max_size=2), st.lists(st.integers(-3, 12), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(discrete_actions, st.integers(1, 10), st.sampled_from([0, -4, 2**63]))
def test_a_discrete_action_in_any_form_decodes_as_the_python_path_says(action, n, start):
    act = ActionLayout(spaces.Discrete(n, start=start, dtype=np.uint64 if start > 0 else np.int64))
    got = fast_decode(act.spec, action)
    try:
        expected = act.checked_decode(action)
    except EmulationError:
        assert got is None
        return
    except (TypeError, ValueError):  # text and None: refused by NumPy on the Python path, not taken by C
        assert got is None
        return
    if got is not None:
        assert_same_native(got, expected)


def test_the_discrete_refusal_names_the_agent_and_the_space():
    act = ActionLayout(spaces.Discrete(9))
    for bad in (9, np.int64(-1), np.array([9])):
        with pytest.raises(EmulationError, match=r"action (9|-1) for agent 'p' is outside its Discrete\(9\) choices"):
            act.decode(bad, who=" for agent 'p'")


def test_the_c_decoder_is_rebuilt_after_pickling():
    act = ActionLayout(spaces.Dict({"d": spaces.Discrete(5, start=2), "b": spaces.Box(-1, 1, (2,), np.float32)}))
    back = pickle.loads(pickle.dumps(act))
    assert back.spec is not None and back == act
    action = {"discrete": np.array([4]), "continuous": np.array([0.5, -1.0], np.float32)}
    assert_same_native(fast_decode(back.spec, action), act.checked_decode(action))


def test_a_float16_box_decodes_on_the_python_path():
    act = ActionLayout(spaces.Box(-1, 1, (2,), np.float16))
    assert act.spec is None
    assert act.decode(np.array([0.5, -1.0], np.float16)).dtype == np.float16
    with pytest.raises(EmulationError, match="outside the Box bounds"):
        act.decode(np.array([0.5, 2.0], np.float16))


@pytest.mark.parametrize("space", [spaces.Box(0, 1, (0,), np.float32),
                                   spaces.Dict({"a": spaces.Box(0, 1, (0,), np.float32), "d": spaces.Discrete(3)})])
def test_an_empty_part_decodes_on_the_python_path(space):
    act = ActionLayout(space)
    assert act.spec is None
    space.seed(0)
    native = space.sample()
    assert act.layout.pack(act.decode(act.encode(native))).tobytes() == act.layout.pack(native).tobytes()


def test_a_malformed_spec_is_refused():
    with pytest.raises(ValueError, match="form"):
        _fastaction.action_spec(0, 0, 1, b"", b"", b"\0" * 8, b"\0" * 8, (), 0)
    with pytest.raises(ValueError, match="names a leaf"):
        _fastaction.action_spec(0, 1, 0, np.int64(2).tobytes(), np.uint64(0).tobytes(), b"", b"",
                                ((True, True, np.dtype(np.int64), (), 0),), 1)
    with pytest.raises(ValueError, match="outside its part"):
        _fastaction.action_spec(0, 1, 0, np.int64(2).tobytes(), np.uint64(0).tobytes(), b"", b"",
                                ((True, False, np.dtype(np.int64), (2,), 0),), 0)


# ---------------------------------------------------------------- through emulate and the vector backends

HYBRID = spaces.Dict({"move": spaces.Discrete(5, start=-2), "aim": spaces.Box(-1, 1, (2,), np.float32),
                      "mode": spaces.Tuple((spaces.MultiBinary(2), spaces.Box(-3, 3, (), np.float64)))})


class Recorder(gymnasium.Env):
    """Remembers every native action it receives."""

    observation_space = spaces.Box(0, 1, (2,), np.float32)

    def __init__(self, action_space=HYBRID):
        self.action_space = action_space
        self.received = []

    def reset(self, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.received.append(action)
        return np.zeros(2, np.float32), 0.0, False, False, {}


@pytest.mark.parametrize("space", [HYBRID, spaces.MultiDiscrete([3, 4], start=[1, -1]),
                                   spaces.Box(-2, 2, (3,), np.float64), spaces.Discrete(4, start=1)])
def test_emulate_step_hands_the_env_what_decode_gives(space):
    env = emulate(Recorder(space))
    env.reset(seed=0)
    act = env.emulated.action
    env.single_action_space.seed(0)
    for _ in range(20):
        action = env.single_action_space.sample()
        env.step(action)
        assert_same_native(env.env.received[-1], act.checked_decode(action))


@pytest.mark.parametrize("backend", ["serial", "multiprocessing"])
def test_vector_envs_decode_every_row_of_a_hybrid_batch(backend):
    kwargs = {"num_workers": 1} if backend == "multiprocessing" else {}
    envs = vector.make(lambda: Recorder(), 4, backend=backend, **kwargs)
    try:
        envs.reset(seed=0)
        act = ActionLayout(HYBRID)
        rng = np.random.default_rng(0)
        batch = {"discrete": rng.integers(0, act.nvec, (4, act.num_discrete)),
                 "continuous": rng.uniform(-1, 1, (4, act.num_continuous)).astype(np.float32)}
        envs.step(batch)
        received = envs.call("__getattribute__", "received") if backend == "multiprocessing" else \
            [e.env.received for e in envs.envs]
        for k in range(4):
            assert_same_native(received[k][-1], act.checked_decode(row_of(batch, k)))
        batch["continuous"][2, 0] = np.nan
        with pytest.raises(EmulationError, match=r"row 2 \(env 2, agent 0\)"):
            envs.step(batch)
    finally:
        envs.close()


def test_a_leaf_a_policy_cannot_emit_is_refused_by_path():
    with pytest.raises(EmulationError, match=r"action leaf \['say'\]: text action spaces are not supported"):
        ActionLayout(spaces.Dict({"say": spaces.Text(5), "move": spaces.Discrete(3)}))


WITHOUT_C = r"""
import sys
sys.modules["packrl.emulation._fastaction"] = None  # as if built without a C compiler: the import fails
import numpy as np
from gymnasium import spaces
from packrl import EmulationError, vector
from packrl.emulation.actions import ActionLayout, fast_decode
act = ActionLayout(spaces.Dict({"d": spaces.Discrete(5, start=2), "b": spaces.Box(-1, 1, (2,), np.float32)}))
assert act.spec is None
action = {"discrete": np.array([4]), "continuous": np.array([0.5, -1.0], np.float32)}
assert fast_decode(act.spec, action) is None
native = act.decode(action)
assert native["d"] == 6 and native["b"].dtype == np.float32 and native["b"].tolist() == [0.5, -1.0], native
batch = {"discrete": np.array([[4], [0]]), "continuous": np.array([[0.5, -1.0], [0.0, np.nan]], np.float32)}
assert act.check_batch(batch["discrete"], batch["continuous"]) == 1
try:
    act.decode_batch(batch, " (env {})")
    raise SystemExit("a NaN action was decoded")
except EmulationError as err:
    assert "(env 1)" in str(err) and "not a number" in str(err), err
import gymnasium
class Recorder(gymnasium.Env):
    observation_space = spaces.Box(0, 1, (2,), np.float32)
    action_space = act.space
    def reset(self, seed=None, options=None):
        return np.zeros(2, np.float32), {}
    def step(self, action):
        self.last = action
        return np.zeros(2, np.float32), 0.0, False, False, {}
envs = vector.make(Recorder, 2)
envs.reset(seed=0)
envs.step(batch | {"continuous": np.zeros((2, 2), np.float32)})
assert [int(e.env.last["d"]) for e in envs.envs] == [6, 2]
try:
    envs.step(batch)
    raise SystemExit("a NaN action reached an env")
except EmulationError as err:
    assert "row 1 (env 1, agent 0)" in str(err), err
print("ok")
"""


def test_without_the_c_extension_actions_decode_and_are_refused_on_the_python_path():
    import subprocess
    import sys

    # quiet: the whole test takes under 1 s
    out = subprocess.run([sys.executable, "-c", WITHOUT_C], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_vector_env_steps_an_action_space_with_an_empty_box():
    space = spaces.Dict({"a": spaces.Box(0, 1, (0,), np.float32), "d": spaces.Discrete(3)})
    envs = vector.make(lambda: Recorder(space), 2)
    try:
        envs.reset(seed=0)
        envs.step({"discrete": np.array([[2], [0]]), "continuous": np.zeros((2, 0), np.float32)})
        assert [int(e.env.received[-1]["d"]) for e in envs.envs] == [2, 0]
        with pytest.raises(EmulationError, match=r"row 1 \(env 1, agent 0\)"):
            envs.step({"discrete": np.array([[2], [3]]), "continuous": np.zeros((2, 0), np.float32)})
    finally:
        envs.close()
