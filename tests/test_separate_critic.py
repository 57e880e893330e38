"""``policy.critic = "separate"``: the value head reads its own encoder and MLP, sharing no weight with the actor."""
import gymnasium as gym
import pytest
import torch

from packrl import config as settings
from packrl import vector
from packrl.errors import ConfigError, EmulationError
from packrl.models import Policy, TwinMLP
from packrl.train.run import build_ppo, load_policy, save


@pytest.fixture
def env():
    vecenv = vector.make(lambda: gym.make("CartPole-v1"), 4, seed=0)
    yield vecenv
    vecenv.close()


def _rows(env, steps=3):
    obs, _ = env.reset(seed=1)
    rows = [torch.as_tensor(obs).clone()]
    for _ in range(steps - 1):
        obs, *_ = env.step(env.action_space.sample())
        rows.append(torch.as_tensor(obs).clone())
    return torch.stack(rows, 1)  # (envs, time, ...)


def test_values_depend_only_on_the_critic_path_and_logits_only_on_the_actor_path(env):
    """The twin layer is block-diagonal and the projection's halves feed one path each: the value's gradient
    reaches only the critic's rows and block, the logits' only the actor's."""
    torch.manual_seed(0)
    policy = Policy.from_env(env, hidden=16, critic="separate")
    assert isinstance(policy.network, TwinMLP) and policy.encoder.project[0].weight.shape[0] == 32
    x = _rows(env)[:, 0]
    logits, values, _ = policy.forward_eval(x)
    projection, twin = policy.encoder.project[0], policy.network

    def grads(output):
        policy.zero_grad()
        output.sum().backward(retain_graph=True)
        return (projection.weight.grad[:16], projection.weight.grad[16:], twin.weight.grad[0], twin.weight.grad[1],
                policy.decoder.actor.discrete.weight.grad, policy.decoder.critic.linear.weight.grad)

    actor_rows, critic_rows, actor_block, critic_block, actor_head, critic_head = grads(values)
    assert not actor_rows.any() and not actor_block.any() and actor_head is None
    assert critic_rows.any() and critic_block.any() and critic_head.any()
    actor_rows, critic_rows, actor_block, critic_block, actor_head, critic_head = grads(logits)
    assert actor_rows.any() and actor_block.any() and actor_head.any()
    assert not critic_rows.any() and not critic_block.any() and critic_head is None


def test_the_twin_layer_equals_two_linear_layers(env):
    twin = TwinMLP(8)
    x = torch.randn(5, 16)
    out = twin.step(x, ())[0]
    for i in range(2):
        want = torch.relu(torch.nn.functional.linear(x[:, 8 * i:8 * (i + 1)], twin.weight[i], twin.bias[i, 0]))
        torch.testing.assert_close(out[i], want)


def test_training_forward_equals_stepping(env):
    torch.manual_seed(0)
    separate = Policy.from_env(env, hidden=16, critic="separate")
    torch.manual_seed(0)
    shared = Policy.from_env(env, hidden=16)
    x = _rows(env)
    logits, values, _ = separate.forward(x)
    for t in range(x.shape[1]):
        step_logits, step_values, _ = separate.forward_eval(x[:, t])
        torch.testing.assert_close(step_logits, logits[:, t])
        torch.testing.assert_close(step_values, values[:, t])
    assert not any(n.startswith("critic") for n, _ in separate.named_parameters())
    assert sum(p.numel() for p in separate.parameters()) > sum(p.numel() for p in shared.parameters())


def test_a_separate_critic_needs_the_mlp_network(env):
    with pytest.raises(EmulationError, match="critic='separate' needs network='mlp'"):
        Policy.from_env(env, network="lstm", hidden=16, critic="separate")
    with pytest.raises(EmulationError, match="critic must be one of"):
        Policy.from_env(env, hidden=16, critic="both")
    with pytest.raises(ConfigError, match="policy.critic = 'separate' needs policy.network = 'mlp'"):
        settings.resolve(flags={"env": {"id": "CartPole-v1"}, "policy": {"critic": "separate", "network": "gru"}})


def test_a_separate_critic_trains_saves_and_loads(tmp_path):
    config, _ = settings.resolve(flags={"env": {"id": "cartpole"}, "train": {"seed": 0, "total_steps": 512},
                                        "policy": {"critic": "separate", "hidden": 16}})
    ppo = build_ppo(config)
    before = {k: v.clone() for k, v in ppo.policy.state_dict().items()}
    ppo.train(512)
    after = ppo.policy.state_dict()
    assert after["network.weight"].shape == (2, 16, 16)
    assert all(not torch.equal(before[k], after[k]) for k in after if k.endswith("weight"))
    path = save(ppo, config, tmp_path / "checkpoint", [])
    ppo.env.close()
    policy, _, vecenv = load_policy(path)
    vecenv.close()
    assert isinstance(policy.network, TwinMLP)
    for k, v in policy.state_dict().items():
        torch.testing.assert_close(v, after[k])


def test_the_presets_separate_critic_gives_way_to_a_network_the_user_chooses():
    """classic-control's separate critic belongs to its MLP: `--network gru` on CartPole trains a GRU with the
    shared trunk, where asking for both a separate critic and a GRU is refused."""
    config, preset = settings.resolve(flags={"env": {"id": "CartPole-v1"}})
    assert preset.name == "classic-control" and config["policy"]["critic"] == "separate"
    config, _ = settings.resolve(flags={"env": {"id": "CartPole-v1"}, "policy": {"network": "gru"}})
    assert config["policy"]["network"] == "gru" and config["policy"]["critic"] == "shared"
    assert config["train"]["update_epochs"] == 20  # the rest of the preset stays
    with pytest.raises(ConfigError, match="policy.critic = 'separate' needs policy.network = 'mlp'"):
        settings.resolve(flags={"env": {"id": "CartPole-v1"}, "policy": {"network": "gru", "critic": "separate"}})
