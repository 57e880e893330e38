"""``policy.critic = "separate"``: the value head reads its own encoder and MLP, sharing no weight with the actor."""
import gymnasium as gym
import pytest
import torch

from packrl import config as settings
from packrl import vector
from packrl.errors import ConfigError, EmulationError
from packrl.models import Policy
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


def test_values_depend_only_on_the_critic_trunk_and_logits_only_on_the_actor(env):
    torch.manual_seed(0)
    policy = Policy.from_env(env, hidden=16, critic="separate")
    x = _rows(env)[:, 0]
    logits, values, _ = policy.forward_eval(x)
    values.sum().backward()
    actor = [*policy.encoder.parameters(), *policy.network.parameters(), *policy.decoder.actor.parameters()]
    critic = [*policy.critic.parameters(), *policy.decoder.critic.parameters()]
    assert all(p.grad is None or not p.grad.any() for p in actor)
    assert all(p.grad is not None and p.grad.any() for p in critic)
    policy.zero_grad()
    logits.sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in critic)
    assert all(p.grad is not None and p.grad.any() for p in actor if p.requires_grad)


def test_training_forward_equals_stepping_and_the_shared_policy_differs(env):
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
    shared_logits, shared_values, _ = shared.forward(x)
    torch.testing.assert_close(shared_logits, logits)  # same seed: the actor path is built first, alike
    assert not torch.allclose(shared_values, values)  # the critic reads another trunk


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
    assert any(k.startswith("critic.") for k in after)
    assert all(not torch.equal(before[k], after[k]) for k in after if k.endswith("weight"))
    path = save(ppo, config, tmp_path / "checkpoint", [])
    ppo.env.close()
    policy, _, vecenv = load_policy(path)
    vecenv.close()
    assert policy.critic is not None
    for k, v in policy.state_dict().items():
        torch.testing.assert_close(v, after[k])
