"""A Layout is a value: building one with round_floats or for a subclass changes no codec after it
is built, and the bound rows a Layout keeps for the last buffer never make a call behave otherwise
than through a fresh bind."""
from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from packrl import EmulationError
from packrl.emulation import Layout
from packrl.emulation.tree import iter_leaves

BOX = spaces.Dict({"x": spaces.Box(-1.0, 1.0, (3,), np.float32), "n": spaces.Discrete(5)})


def codecs_of(layout: Layout) -> list:
    return [node.codec for _, node in iter_leaves(layout.root)]


def test_round_floats_is_a_codec_of_its_own_not_a_changed_one():
    plain = Layout.from_space(BOX)
    rounding = Layout.from_space(BOX, round_floats=True)
    sample = {"x": np.array([0.1, 0.2, 0.3]), "n": 2}  # float64 values float32 cannot hold exactly
    with pytest.raises(EmulationError, match=r"\['x'\].*round_floats=True"):
        plain.pack(sample)
    assert rounding.unpack(rounding.pack(sample))["x"].tolist() == np.float32([0.1, 0.2, 0.3]).tolist()
    with pytest.raises(EmulationError, match=r"\['x'\]"):
        plain.pack(sample)  # still refused: nothing the rounding layout did reached it
    assert plain != rounding and not any(getattr(c, "round_floats", False) for c in codecs_of(plain))


class Narrow(spaces.MultiDiscrete):
    """A subclass packed by its base class's codec."""


def test_a_subclass_hint_is_data_not_a_replaced_method():
    layout = Layout.from_space(spaces.Dict({"m": Narrow([3])}))
    (codec,) = codecs_of(layout)
    assert "check" not in vars(codec) and codec.subclass_hint
    with pytest.raises(EmulationError, match=r"leaf \['m'\].*register_space\(Narrow, builder\)"):
        layout.pack({"m": np.int64(1)})
    with pytest.raises(EmulationError, match=r"\[.m.\].*register_space\(Narrow, builder\)"):
        layout.pack_batch([{"m": np.int64(1)}])


def test_the_last_buffer_kept_behaves_as_a_fresh_bind():
    layout = Layout.from_space(BOX)
    rows = np.zeros(2 * layout.nbytes, np.uint8)
    layout.pack({"x": np.float32([0.5, 0, 0]), "n": 3}, out=rows[: layout.nbytes])
    first = rows[: layout.nbytes]
    assert layout.unpack(first)["n"] == 3
    rows.shape = (2, layout.nbytes)  # the same array, reshaped in place: the views made for it are stale
    unpacked = layout.unpack(rows)
    assert unpacked["n"].shape == (2,) and unpacked["n"].tolist() == [3, 0]
    with pytest.raises(EmulationError, match="pack writes one row"):
        layout.pack({"x": np.float32([0, 0, 0]), "n": 1}, out=rows)
    a, b = layout.unpack(first), layout.unpack(first)
    assert a is not b and a["x"].base is not None  # a new structure of views each call, as bind(rows).unpack()
