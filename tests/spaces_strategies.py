"""Hypothesis strategies: random nested gymnasium spaces and samples with extreme values."""
from __future__ import annotations

import numpy as np
from gymnasium import spaces
from hypothesis import strategies as st

INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
FLOAT_DTYPES = [np.float16, np.float32, np.float64]

shapes = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)
nonempty_shapes = st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple)


@st.composite
def int_boxes(draw):
    dtype = np.dtype(draw(st.sampled_from(INT_DTYPES)))
    info = np.iinfo(dtype)
    if draw(st.booleans()):
        low, high = info.min, info.max
    else:
        low = draw(st.integers(int(info.min), int(info.max)))
        high = draw(st.integers(low, int(info.max)))
    return spaces.Box(low=low, high=high, shape=draw(shapes), dtype=dtype)


@st.composite
def float_boxes(draw):
    dtype = np.dtype(draw(st.sampled_from(FLOAT_DTYPES)))
    if draw(st.booleans()):
        low, high = -np.inf, np.inf
    else:
        low = draw(st.floats(-100, 100, width=16))
        high = low + draw(st.floats(0, 100, width=16))
    return spaces.Box(low=low, high=high, shape=draw(shapes), dtype=dtype)


bool_boxes = shapes.map(lambda s: spaces.Box(0, 1, shape=s, dtype=bool))


@st.composite
def discretes(draw):
    n = draw(st.one_of(st.integers(1, 10), st.integers(1, 2**62)))
    start = draw(st.integers(-(2**62), 2**62 - 1 - n) if n < 2**62 else st.just(0))
    return spaces.Discrete(n, start=start)


@st.composite
def multi_discretes(draw):
    shape = draw(nonempty_shapes)
    big = draw(st.booleans())
    nvec = np.array(draw(st.lists(st.integers(1, 2**40 if big else 9), min_size=int(np.prod(shape)),
                                  max_size=int(np.prod(shape))))).reshape(shape)
    start = np.array(draw(st.lists(st.integers(-(2**40), 2**40), min_size=nvec.size, max_size=nvec.size))).reshape(shape)
    return spaces.MultiDiscrete(nvec, start=start)


multi_binaries = nonempty_shapes.map(lambda s: spaces.MultiBinary(list(s)))


@st.composite
def texts(draw):
    max_length = draw(st.integers(1, 12))
    charset = draw(st.sampled_from(["abc", "0123456789", "αβγδ", None]))
    kwargs = {} if charset is None else {"charset": charset}
    return spaces.Text(max_length, min_length=draw(st.integers(0, max_length)), **kwargs)


leaf_spaces = st.one_of(int_boxes(), float_boxes(), bool_boxes, discretes(), multi_discretes(), multi_binaries, texts())
dict_keys = st.one_of(st.text("abcdefgh", min_size=1, max_size=4), st.integers(-3, 50))


def _containers(children):
    return st.one_of(
        st.dictionaries(dict_keys, children, min_size=1, max_size=4).map(lambda d: spaces.Dict(d)),
        st.lists(children, min_size=1, max_size=4).map(lambda xs: spaces.Tuple(xs)),
    )


nested_spaces = st.recursive(leaf_spaces, _containers, max_leaves=12)


@st.composite
def deep_spaces(draw, depth: int = 4):
    """A space nested at least ``depth`` containers deep."""
    space = draw(nested_spaces)
    for _ in range(depth):
        space = draw(st.sampled_from(["dict", "tuple"])) == "dict" and spaces.Dict({"x": space, 0: draw(leaf_spaces)}) \
            or spaces.Tuple((draw(leaf_spaces), space))
    return space


def sample(space: spaces.Space, rng: np.random.Generator):
    """A sample of ``space``; integer Boxes are drawn with numpy, since gymnasium's ``Box.sample``
    overflows on bounds more than 2**63 apart."""
    if isinstance(space, spaces.Dict):
        return {k: sample(s, rng) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(sample(s, rng) for s in space.spaces)
    if isinstance(space, spaces.Box) and space.dtype.kind in "iu":
        return rng.integers(space.low, space.high, endpoint=True, dtype=space.dtype)
    space.seed(int(rng.integers(2**31)))
    return space.sample()


def extreme(space: spaces.Space, sample, rng: np.random.Generator):
    """Replace some values of a sample by extremes the space allows (int64/uint64 limits, -0.0, NaN payloads, inf)."""
    if isinstance(space, spaces.Dict):
        return {k: extreme(s, sample[k], rng) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(extreme(s, x, rng) for s, x in zip(space.spaces, sample))
    if isinstance(space, spaces.Box) and sample.size:
        out = sample.copy()
        flat = out.reshape(-1)
        i = int(rng.integers(flat.size))
        dtype = out.dtype
        if dtype.kind == "f":
            bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize]
            nan_payload = np.array(np.iinfo(bits).max - int(rng.integers(1, 100)), dtype=bits).view(dtype)
            choices = [-0.0, np.inf, -np.inf, nan_payload]
            if dtype == np.float64:
                choices += [1e300, -3.5e38 * 10, 2.0**-1074]
            flat[i] = choices[int(rng.integers(len(choices)))]
        elif dtype.kind in "iu" and np.all(space.low == np.iinfo(dtype).min) and np.all(space.high == np.iinfo(dtype).max):
            flat[i] = np.iinfo(dtype).max if rng.integers(2) else np.iinfo(dtype).min
        return out
    if isinstance(space, spaces.Discrete) and rng.integers(2):
        return np.int64(space.start + space.n - 1)
    return sample
