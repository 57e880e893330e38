"""The MiniGrid leaf encoders: 'cells' (an image of codes, each code embedded) and 'words' (a string as hashed
words and word pairs), on real MiniGrid observations and on generated strings."""
import gymnasium as gym
import minigrid  # noqa: F401  (registers the ids)
import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given
from hypothesis import strategies as st

from packrl import vector
from packrl.emulation import Layout
from packrl.emulation.codecs import TextView
from packrl.errors import EmulationError
from packrl.models import Policy
from packrl.models.encoders import (
    CellEncoder,
    LayoutEncoder,
    WordEncoder,
    build_leaf_encoder,
    default_choice,
)
from packrl.nativize import nativize

WORDS = st.sampled_from(["go", "to", "the", "red", "blue", "door", "key", "ball", "open", "then", "pick", "up"])
GAPS = st.sampled_from([" ", "  ", ", ", " . ", "\t"])


def text_view(strings: list[str], capacity: int = 64, garbage: int = 0) -> TextView:
    """Strings as a packed string leaf: UTF-8 bytes, the rest of the row filled with ``garbage``."""
    chars = torch.full((len(strings), capacity), garbage, dtype=torch.uint8)
    for i, s in enumerate(strings):
        chars[i, :len(s.encode())] = torch.tensor(list(s.encode()), dtype=torch.uint8)
    return TextView(chars, torch.tensor([len(s.encode()) for s in strings], dtype=torch.int32))


def mission_encoder() -> WordEncoder:
    torch.manual_seed(0)
    layout = Layout.from_space(gym.make("MiniGrid-GoToDoor-5x5-v0").observation_space)
    leaf = next(leaf for leaf in layout.leaves if leaf.path == ("mission",))
    assert default_choice(leaf) == "words"
    return build_leaf_encoder(leaf, "words")


@given(st.lists(WORDS, min_size=1, max_size=8), st.lists(GAPS, min_size=9, max_size=9), st.integers(0, 255))
def test_words_read_the_words_not_the_spacing_or_the_padding(words, gaps, garbage):
    encoder = mission_encoder()
    plain = " ".join(words)
    spaced = gaps[0].lstrip(",.") + "".join(w + g for w, g in zip(words, gaps[1:]))
    with torch.no_grad():
        a = encoder(text_view([plain]))
        b = encoder(text_view([spaced], garbage=garbage))
    torch.testing.assert_close(a, b)


@given(st.lists(WORDS, min_size=2, max_size=6, unique=True))
def test_word_order_changes_the_pairs_but_not_the_bag_of_words(words):
    encoder = mission_encoder()
    with torch.no_grad():
        forward, backward = encoder(text_view([" ".join(words), " ".join(reversed(words))]))
    half = encoder.output_size // 2
    torch.testing.assert_close(forward[:half], backward[:half])  # same words
    assert not torch.allclose(forward[half:], backward[half:])  # other neighbours


def test_each_door_colour_of_gotodoor_gets_its_own_features():
    encoder = mission_encoder()
    colours = ["red", "green", "blue", "purple", "yellow", "grey"]
    with torch.no_grad():
        features = encoder(text_view([f"go to the {c} door" for c in colours]))
    distances = torch.cdist(features, features) + torch.eye(len(colours))
    assert distances.min() > 1e-3, distances


def test_cells_embed_each_code_and_are_layout_independent():
    image = spaces.Box(0, 255, (7, 7, 3), np.uint8)
    leaf = Layout.from_space(image).leaves[0]
    torch.manual_seed(0)
    encoder = build_leaf_encoder(leaf, "cells")
    assert isinstance(encoder, CellEncoder) and encoder.output_size == 64
    env = gym.make("MiniGrid-DoorKey-5x5-v0")
    x = torch.as_tensor(np.stack([env.reset(seed=s)[0]["image"] for s in range(4)]))
    changed = x.clone()
    changed[0, 3, 6, 1] += 1  # one cell's colour code
    with torch.no_grad():
        out, out_changed = encoder(x), encoder(changed)
    assert torch.allclose(out[1:], out_changed[1:]) and not torch.allclose(out[0], out_changed[0])
    channels_first = CellEncoder(Layout.from_space(spaces.Box(0, 255, (3, 7, 7), np.uint8)).leaves[0], False)
    channels_first.load_state_dict(encoder.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(channels_first(x.permute(0, 3, 1, 2)), out)


def test_cells_refuse_float_images_and_unbounded_codes():
    with pytest.raises(EmulationError, match=r"leaf \['image'\]: 'cells' needs an integer image of codes"):
        build_leaf_encoder(Layout.from_space(spaces.Dict({"image": spaces.Box(0, 1, (7, 7, 3))})).leaves[0], "cells")
    huge = spaces.Box(0, 2**31 - 1, (7, 7, 3), np.int32)
    with pytest.raises(EmulationError, match="too many to embed"):
        build_leaf_encoder(Layout.from_space(huge).leaves[0], "cells")


def test_minigrid_policy_compiles_and_matches_eager():
    env = vector.make(lambda: gym.make("MiniGrid-GoToDoor-5x5-v0"), 4, seed=0)
    obs, _ = env.reset(seed=0)
    torch.manual_seed(0)
    policy = Policy.from_env(env, overrides={"image": "cells"})
    x = torch.as_tensor(obs)
    with torch.no_grad():
        want = policy.forward_eval(x, ())
        got = torch.compile(policy.forward_eval, fullgraph=True)(x, ())
    env.close()
    for w, g in zip(want[:2], got[:2]):
        torch.testing.assert_close(w, g, rtol=1e-4, atol=1e-5)


def test_the_mission_steers_the_grid_encoder_and_starts_unsteered():
    """Fetch names its target only in the mission: with conditioning (the default) the 'cells' encoder takes the
    mission's words (FiLM on the cell embeddings), so two missions over one grid give two grid features once the
    map has learned anything; the map starts at zero, so at first they are the unconditioned features."""
    env = gym.make("MiniGrid-Fetch-5x5-N2-v0")
    obs, _ = env.reset(seed=0)
    layout = Layout.from_space(env.observation_space)
    rows = torch.as_tensor(np.stack([layout.pack(obs), layout.pack({**obs, "mission": "fetch a blue key"})]))
    torch.manual_seed(0)
    encoder = LayoutEncoder(layout, 64, {"image": "cells"})
    (source,), (steered,) = encoder.sources, encoder.steered
    words, cells = encoder.leaf_encoders[source], encoder.leaf_encoders[steered]
    assert isinstance(words, WordEncoder) and isinstance(cells, CellEncoder) and cells.film is not None
    native = nativize(rows, layout)
    with torch.no_grad():
        mission = words(TextView(native["mission"].chars, native["mission"].length))
        assert not torch.allclose(mission[0], mission[1])
        at_start = cells(native["image"], mission)
        torch.testing.assert_close(at_start[0], at_start[1])
        torch.testing.assert_close(at_start, cells(native["image"]))
        torch.nn.init.normal_(cells.film.weight)
        steered = cells(native["image"], mission)
        assert not torch.allclose(steered[0], steered[1])
        torch.testing.assert_close(encoder(rows)[0], encoder(rows[:1])[0])
    assert LayoutEncoder(layout, 64, {"image": "cells"}, condition=False).steered == ()
    assert LayoutEncoder(layout, 64, {"image": "cells", "mission": "drop"}).steered == ()


def test_weights_saved_before_the_steering_load_as_the_unsteered_encoder():
    layout = Layout.from_space(gym.make("MiniGrid-Fetch-5x5-N2-v0").observation_space)
    torch.manual_seed(0)
    old = LayoutEncoder(layout, 64, {"image": "cells"}, condition=False)
    new = LayoutEncoder(layout, 64, {"image": "cells"})
    torch.nn.init.normal_(new.leaf_encoders[new.steered[0]].film.weight)
    new.load_state_dict(old.state_dict())
    env = gym.make("MiniGrid-Fetch-5x5-N2-v0")
    rows = torch.as_tensor(np.stack([layout.pack(env.reset(seed=s)[0]) for s in range(4)]))
    with torch.no_grad():
        torch.testing.assert_close(new(rows), old(rows))
