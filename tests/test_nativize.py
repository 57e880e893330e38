"""nativize under torch.compile(fullgraph=True), on CPU and (when present) CUDA."""
from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces

from packrl import NativizeError
from packrl.emulation import Layout, emulate
from packrl.nativize import nativize

SPACE = spaces.Dict({
    "flags": spaces.Box(0, 1, (3,), bool),
    "nested": spaces.Tuple((
        spaces.Box(0, 65535, (2, 2), np.uint16),
        spaces.Dict({"x": spaces.Box(-np.inf, np.inf, (3,), np.float64), "d": spaces.Discrete(9, start=-4)}),
    )),
    "text": spaces.Text(6, charset="xyz"),
})
LAYOUT = Layout.from_space(SPACE)


def rows(n, seed=0):
    SPACE.seed(seed)
    return LAYOUT.pack_batch([SPACE.sample() for _ in range(n)])


def flat(tree):
    if isinstance(tree, dict):
        return [t for k in tree for t in flat(tree[k])]
    if isinstance(tree, tuple):
        return [t for x in tree for t in flat(x)]
    return [tree]


def test_compiled_nativize_has_no_graph_breaks_and_matches_eager():
    torch._dynamo.reset()
    x = torch.from_numpy(rows(5))
    explained = torch._dynamo.explain(lambda t: nativize(t, LAYOUT))(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(lambda t: nativize(t, LAYOUT), fullgraph=True)
    got, want = compiled(x), nativize(x, LAYOUT)
    dtypes = [t.dtype for t in flat(got)]
    assert torch.bool in dtypes and torch.uint16 in dtypes and torch.float64 in dtypes
    for g, w in zip(flat(got), flat(want)):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.view(torch.uint8) if g.dtype == torch.bool else g, w.view(torch.uint8) if w.dtype == torch.bool else w)


def test_compiled_consumer_reads_leaves_correctly():
    torch._dynamo.reset()

    def total(t):
        leaves = nativize(t, LAYOUT)
        u16, inner = leaves["nested"]
        return inner["x"].sum(-1) + u16.to(torch.float64).sum((-1, -2)) + inner["d"].to(torch.float64)

    x = torch.from_numpy(rows(4, seed=3))
    compiled = torch.compile(total, fullgraph=True)
    ref = [s["nested"][1]["x"].sum() + s["nested"][0].astype(np.float64).sum() + s["nested"][1]["d"]
           for s in [LAYOUT.to_native(LAYOUT.unpack(r)) for r in x.numpy()]]
    assert torch.allclose(compiled(x), torch.tensor(ref, dtype=torch.float64))


def test_views_share_the_input_storage():
    x = torch.from_numpy(rows(3))
    for view in flat(nativize(x, LAYOUT)):
        assert view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_batch_dims_are_kept():
    x = torch.from_numpy(rows(6)).view(2, 3, LAYOUT.nbytes)
    views = nativize(x, LAYOUT)
    assert views["nested"][1]["d"].shape == (2, 3)
    assert views["nested"][0].shape == (2, 3, 2, 2)


def test_numpy_input_gives_numpy_views():
    r = rows(2)
    views = nativize(r, LAYOUT)
    assert isinstance(views["flags"], np.ndarray) and np.shares_memory(views["flags"], r)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_views_are_exact_and_compile():
    x = torch.from_numpy(rows(8)).cuda()
    compiled = torch.compile(lambda t: nativize(t, LAYOUT), fullgraph=True)
    for g, c in zip(flat(compiled(x)), flat(nativize(x.cpu(), LAYOUT))):
        assert g.device.type == "cuda" and g.dtype == c.dtype
        assert torch.equal(g.cpu().view(torch.uint8) if g.dtype == torch.bool else g.cpu(),
                           c.view(torch.uint8) if c.dtype == torch.bool else c)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_a_plain_box_layout_takes_the_rows_emulate_passes_through(env_id):
    env = emulate(gymnasium.make(env_id))
    env.reset(seed=0)
    layout = env.emulated.observation
    rows = torch.from_numpy(env.observations)  # the Box itself (float32), not packed bytes
    assert nativize(rows, layout) is rows and nativize(env.observations, layout) is env.observations
    compiled = torch.compile(lambda x: nativize(x, layout) * 2, fullgraph=True)
    assert torch.equal(compiled(rows), rows * 2)
    with pytest.raises(NativizeError, match="this Box's own rows: dtype float32"):
        nativize(rows.double(), layout)
    packed = torch.from_numpy(layout.pack_batch(list(env.observations)))  # packed bytes work too
    assert torch.equal(nativize(packed, layout), rows)
