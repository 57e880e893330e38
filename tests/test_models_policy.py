"""Policies end to end: every action kind's shapes, gradients to every parameter, eager vs compiled,
real MiniGrid / chess / Pendulum / MPE2 envs through emulate, encoder overrides, the legacy wrapper."""
import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

from packrl import EmulationError, NativizeError
from packrl.emulation import ActionLayout, Layout, emulate
from packrl.models import Flat, LayoutEncoder, LSTMWrapper, Policy, leaf_tensors

RICH = spaces.Dict({
    "pos": spaces.Box(-2, 2, (3,), np.float32),
    "speed": spaces.Box(-np.inf, np.inf, (2,), np.float64),
    "count": spaces.Box(0, 2**40, (1,), np.int64),
    "seen": spaces.Box(0, 1, (4,), bool),
    "room": spaces.Discrete(5, start=3),
    "keys": spaces.MultiDiscrete([[2, 3], [4, 5]]),
    "doors": spaces.MultiBinary(3),
    "view": spaces.Box(0, 255, (7, 7, 3), np.uint8),
    "note": spaces.Text(6),
    "nested": spaces.Tuple((spaces.Discrete(2), spaces.Box(-1, 1, (2,), np.float32))),
})
RICH_LAYOUT = Layout.from_space(RICH)

ACTIONS = {
    "discrete": spaces.Discrete(7, start=-3),
    "multidiscrete": spaces.MultiDiscrete([[2, 3], [4, 5]]),
    "multibinary": spaces.MultiBinary(4),
    "box": spaces.Box(np.array([[-1, 0, -np.inf], [2, -5, -np.inf]], np.float32),
                      np.array([[1, np.inf, 3], [4, 5, np.inf]], np.float32)),
    "hybrid": spaces.Dict({"move": spaces.Discrete(3), "aim": spaces.Box(-1, 1, (2,), np.float32),
                           "mode": spaces.Tuple((spaces.MultiBinary(2), spaces.Discrete(4, start=1)))}),
}


def _rows(layout, space, n, seed=0):
    space.seed(seed)
    return torch.from_numpy(layout.pack_batch([space.sample() for _ in range(n)]))


@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_shapes_and_env_actions_for_every_action_kind(name):
    space = ACTIONS[name]
    action_layout = ActionLayout(space)
    policy = Policy.from_layouts(RICH_LAYOUT, action_layout, "gru", hidden=16)
    agents = 6
    logits, values, state = policy.forward_eval(_rows(RICH_LAYOUT, RICH, agents), policy.initial_state(agents))
    width = int(action_layout.nvec.sum()) + 2 * action_layout.num_continuous
    assert logits.shape == (agents, width) and values.shape == (agents,) and state[0].shape == (agents, 16)
    dist = policy.distribution(logits)
    action = dist.sample()
    assert dist.log_prob(action).shape == (agents,) and dist.entropy().shape == (agents,)
    env_action = policy.decoder.to_numpy(action)
    k, m = action_layout.num_discrete, action_layout.num_continuous
    if action_layout.kind == "discrete":
        assert env_action.shape == (agents,) and env_action.dtype == np.int64
    elif action_layout.kind == "multidiscrete":
        assert env_action.shape == (agents, k) and env_action.dtype == np.int64
    elif action_layout.kind == "continuous":
        assert env_action.shape == (agents, m) and env_action.dtype == np.float32
    else:
        assert env_action["discrete"].shape == (agents, k) and env_action["continuous"].shape == (agents, m)
    for i in range(agents):
        one = {key: v[i] for key, v in env_action.items()} if isinstance(env_action, dict) else env_action[i]
        assert space.contains(action_layout.decode(one))  # the env receives valid native actions


def test_gradients_reach_every_parameter():
    torch.manual_seed(0)
    policy = Policy.from_layouts(RICH_LAYOUT, ACTIONS["hybrid"], "lstm", hidden=16,
                                 overrides={"view": "impala"})
    x = _rows(RICH_LAYOUT, RICH, 12).reshape(3, 4, -1)
    done = torch.zeros(3, 4, dtype=torch.bool)
    done[1, 2] = True
    logits, values, _ = policy(x, policy.initial_state(3), done)
    dist = policy.distribution(logits)
    loss = -dist.log_prob(dist.sample()).mean() - dist.entropy().mean() + values.pow(2).mean()
    loss.backward()
    missing = [n for n, p in policy.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, f"no gradient for {missing}"


def test_eager_and_compiled_forward_eval_agree():
    space = spaces.Dict({"pos": spaces.Box(-2, 2, (3,), np.float32), "seen": spaces.Box(0, 1, (4,), bool),
                         "room": spaces.Discrete(5, start=3), "action_mask": spaces.Box(0, 1, (6,), np.int8)})
    layout = Layout.from_space(space)
    torch.manual_seed(0)
    policy = Policy.from_layouts(layout, spaces.Discrete(6), "mlp", hidden=8, action_mask=("action_mask",))
    x = _rows(layout, space, 8, seed=3)
    want = policy.forward_eval(x, ())
    got = torch.compile(policy.forward_eval, fullgraph=True)(x, ())
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    mask = torch.from_numpy(layout.unpack(x.numpy())["action_mask"]) != 0
    assert torch.all(got[0][~mask] == torch.finfo(torch.float32).min)


def test_minigrid_observation_through_emulate():
    import minigrid  # noqa: F401  (registers the envs)

    env = emulate(gym.make("MiniGrid-DoorKey-5x5-v0"))
    policy = Policy.from_env(env, network="mingru", hidden=32)
    kinds = {leaf.path: leaf.kind for leaf in env.emulated.observation.leaves}
    assert kinds[("mission",)] == "bounded_string" and kinds[("direction",)] == "discrete"
    obs, _ = env.reset(seed=0)
    state = policy.initial_state(1)
    for _ in range(5):
        logits, values, state = policy.forward_eval(torch.from_numpy(obs), state)
        assert logits.shape == (1, 7) and values.shape == (1,)
        action = policy.decoder.to_numpy(policy.distribution(logits).sample())
        obs, _, terminals, truncations, _ = env.step(action)
        assert np.isfinite(values.detach().numpy()).all()
    # the encoder reads the mission: two different missions give different features
    a, b = obs.copy(), obs.copy()
    b[0, :] = env.emulated.observation.pack({**env.emulated.observation.to_native(env.emulated.observation.unpack(obs[0])),
                                             "mission": "get to the green goal square"})
    assert not torch.allclose(policy.encoder(torch.from_numpy(a)), policy.encoder(torch.from_numpy(b)))


def test_chess_observation_mask_only_legal_moves():
    from pettingzoo.classic import chess_v6

    env = emulate(chess_v6.env())
    policy = Policy.from_env(env, network="mlp", hidden=32)
    assert policy.action_mask is not None and policy.action_mask.width == 4672
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        row = int(np.flatnonzero(env.masks)[0])  # the acting player
        legal = env.emulated.observation.unpack(obs[row])["action_mask"].astype(bool)
        x = torch.from_numpy(obs[row:row + 1]).expand(500, -1)
        logits, _, _ = policy.forward_eval(x, ())
        choices = policy.distribution(logits).sample().numpy()
        assert legal[choices].all() and len(set(choices.tolist())) > 1
        actions = np.zeros(env.num_agents, np.int64)
        actions[row] = choices[0]
        obs, *_ = env.step(actions)


def test_box_observation_passthrough_and_box_action_on_pendulum():
    env = emulate(gym.make("Pendulum-v1"))
    policy = Policy.from_env(env, network="mlp", hidden=16)
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.float32 and obs.shape == (1, 3)
    for _ in range(3):
        logits, values, _ = policy.forward_eval(torch.from_numpy(obs), ())
        dist = policy.distribution(logits)
        action = dist.sample()
        assert action.shape == (1, 1) and torch.isfinite(dist.log_prob(action)).all()
        obs, *_ = env.step(policy.decoder.to_numpy(action))


def test_heterogeneous_groups_get_one_policy_each():
    from mpe2 import simple_adversary_v3

    env = emulate(simple_adversary_v3.parallel_env(max_cycles=5))
    with pytest.raises(EmulationError, match="per_group"):
        Policy.from_env(env)
    policies = Policy.per_group(env, network="gru", hidden=16)
    obs, _ = env.reset(seed=0)
    actions = np.zeros(env.num_agents, np.int64)
    for group, policy in zip(env.emulated.groups, policies):
        rows = torch.from_numpy(obs[list(group.rows)])  # rows padded to the widest layout
        logits, values, _ = policy.forward_eval(rows, policy.initial_state(len(group.rows)))
        assert logits.shape == (len(group.rows), 5) and values.shape == (len(group.rows),)
        actions[list(group.rows)] = policy.decoder.to_numpy(policy.distribution(logits).sample())
    env.step(actions)


def test_overrides_drop_choose_and_replace_leaves():
    base = LayoutEncoder(RICH_LAYOUT, 8)
    dropped = LayoutEncoder(RICH_LAYOUT, 8, overrides={"pos": "drop", ("nested", 1): None})
    assert dropped.concat_size == base.concat_size - 3 - 2

    class Count(nn.Module):
        output_size = 1

        def forward(self, x):
            return x.float().log1p()

    custom = LayoutEncoder(RICH_LAYOUT, 8, overrides={"count": Count(), "view": "impala", "keys": "flat"})
    x = _rows(RICH_LAYOUT, RICH, 3)
    assert custom(x).shape == (3, 8)
    with pytest.raises(EmulationError, match="overrides name no leaf.*'nope'"):
        LayoutEncoder(RICH_LAYOUT, 8, overrides={"nope": "drop"})
    with pytest.raises(ValueError, match="unknown encoder 'cnnn'"):
        LayoutEncoder(RICH_LAYOUT, 8, overrides={"view": "cnnn"})
    with pytest.raises(NativizeError, match="float32"):
        base(x.float())


def test_mask_width_must_match_the_action_space():
    space = spaces.Dict({"obs": spaces.Box(0, 1, (2,), np.float32), "action_mask": spaces.Box(0, 1, (4,), np.int8)})
    with pytest.raises(EmulationError, match="4 entries.*5 discrete choices"):
        Policy.from_layouts(Layout.from_space(space), spaces.Discrete(5), action_mask=("action_mask",))


class OldStylePolicy(nn.Module):
    """A policy in the older encode_observations / decode_actions style, over packed rows."""

    def __init__(self, layout, nvec):
        super().__init__()
        self.layout, self.nvec = layout, nvec
        self.encode = nn.Linear(3, 12)
        self.actors = nn.ModuleList(nn.Linear(12, n) for n in nvec)
        self.value = nn.Linear(12, 1)

    def encode_observations(self, obs):
        from packrl.nativize import nativize

        pos = nativize(obs, self.layout)["pos"]
        return torch.relu(self.encode(pos)), pos.shape[0]

    def decode_actions(self, hidden, lookup):
        assert hidden.shape[0] == lookup
        return [actor(hidden) for actor in self.actors], self.value(hidden)


def test_legacy_policy_through_the_recurrent_wrapper():
    space = spaces.Dict({"pos": spaces.Box(-1, 1, (3,), np.float32), "other": spaces.Discrete(3)})
    layout = Layout.from_space(space)
    torch.manual_seed(0)
    wrapped = LSTMWrapper(OldStylePolicy(layout, [3, 4]), spaces.MultiDiscrete([3, 4]), input_size=12, hidden_size=12)
    x = _rows(layout, space, 8).reshape(2, 4, -1)
    done = torch.tensor([[False, False, True, False], [False, True, False, False]])
    logits, values, _ = wrapped(x, wrapped.initial_state(2), done)
    assert logits.shape == (2, 4, 7) and values.shape == (2, 4)
    state, stepped = wrapped.initial_state(2), []
    for t in range(4):
        lg, _, state = wrapped.forward_eval(x[:, t], state, done[:, t])
        stepped.append(lg)
    torch.testing.assert_close(torch.stack(stepped, 1), logits, rtol=1e-5, atol=1e-5)
    assert wrapped.distribution(logits).sample().shape == (2, 4, 2)
    assert len(wrapped.state_dict()) == len(set(map(id, wrapped.parameters())))  # weights listed once
    with pytest.raises(TypeError, match="encode_observations"):
        LSTMWrapper(nn.Linear(2, 2), spaces.Discrete(2))


def test_fused_flat_read_equals_each_leaf_read_alone():
    """The flat leaves read together (a slice, a view and a cast per dtype, one scaling) equal Flat applied to each
    leaf's own view, column for column, and the features equal the projection of every part side by side."""
    torch.manual_seed(0)
    encoder = LayoutEncoder(RICH_LAYOUT, 8)
    x = _rows(RICH_LAYOUT, RICH, 16)
    views = {(leaf.path, leaf.field): v for leaf, v in zip(RICH_LAYOUT.leaves, leaf_tensors(x, RICH_LAYOUT))}
    assert len(encoder.flat_leaves) > 3 and len({leaf.dtype for leaf in encoder.flat_leaves}) > 2
    want = torch.cat([Flat(leaf)(views[leaf.path, leaf.field]) for leaf in encoder.flat_leaves], -1)
    torch.testing.assert_close(encoder._flat(x), want)
    from packrl.emulation.codecs import TextView

    parts = [want]
    for module, path in zip(encoder.leaf_encoders, encoder.paths):
        fields = [views[leaf.path, leaf.field] for leaf in RICH_LAYOUT.leaves if leaf.path == path]
        parts.append(module(TextView(*fields) if len(fields) == 2 else fields[0]))
    torch.testing.assert_close(encoder(x), encoder.project(torch.cat(parts, -1)), rtol=1e-4, atol=1e-5)


def test_image_leaves_get_conv_encoders_in_either_channel_order():
    from packrl.models import ImageEncoder

    space = spaces.Dict({"rgb": spaces.Box(0, 255, (3, 40, 40), np.uint8), "grid": spaces.Box(0, 10, (9, 9, 2), np.uint8)})
    layout = Layout.from_space(space)
    encoder = LayoutEncoder(layout, 8)
    kinds = dict(zip(encoder.paths, encoder.leaf_encoders))
    assert isinstance(kinds[("rgb",)], ImageEncoder) and not kinds[("rgb",)].channels_last
    assert isinstance(kinds[("grid",)], ImageEncoder) and kinds[("grid",)].channels_last
    assert encoder(_rows(layout, space, 2)).shape == (2, 8)
    with pytest.raises(EmulationError, match="36x36"):
        LayoutEncoder(layout, 8, overrides={"grid": "nature"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_policy_matches_cpu_and_compiles():
    torch.manual_seed(0)
    policy = Policy.from_layouts(RICH_LAYOUT, ACTIONS["hybrid"], "mingru", hidden=16)
    x = _rows(RICH_LAYOUT, RICH, 32)
    want = policy.forward_eval(x, policy.initial_state(32))
    gpu = policy.to("cuda")
    got = gpu.forward_eval(x.cuda(), gpu.initial_state(32, "cuda"))
    compiled = torch.compile(gpu.forward_eval, fullgraph=True)(x.cuda(), gpu.initial_state(32, "cuda"))
    for w, g, c in zip(want[:2], got[:2], compiled[:2]):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(c.cpu(), w, rtol=1e-4, atol=1e-4)
    dist = gpu.distribution(got[0])
    assert torch.isfinite(dist.log_prob(dist.sample())).all()
