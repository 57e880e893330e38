"""The fast forms of the policy (``Policy.step_function`` for the rollout, ``Policy.forward_function`` for training,
``ActionSpec.step_sampler``) are the same ops as ``forward_eval``, ``forward`` and ``distribution(...).sample_into``:
the same bits (and gradients), and a PPO run that takes them equals one that cannot (a forward hook turns them
off)."""
import numpy as np
import pytest
import torch
from gymnasium import spaces

from packrl import vector
from packrl.models import Policy
from packrl.models.distributions import ActionSpec
from packrl.models.heads import as_action_layout
from packrl.train.ppo import PPO, PPOConfig


def _policies(env):
    yield Policy.from_env(env, hidden=32)
    yield Policy.from_env(env, hidden=32, critic="separate")
    yield Policy.from_env(env, hidden=32, normalize_observations=True, activation="tanh")


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("env_id", ["cartpole", "gridworld"])
def test_step_function_gives_forward_evals_bits(env_id, device):
    env = vector.make(env_id, 8, backend="numba", seed=0)
    try:
        obs, _ = env.reset(seed=1)
        x = torch.as_tensor(obs).to(device)
        for policy in _policies(env):
            policy.to(device)
            with torch.no_grad():
                for p in policy.parameters():  # not the initial values: every weight matters
                    p.add_(torch.randn_like(p) * 0.1)
            step = policy.step_function(x)
            assert step is not None
            with torch.no_grad():
                logits, values, _ = policy.forward_eval(x)
                fast_values = torch.full((len(x), 1), float("nan"), device=device)
                for _ in range(2):  # the second call overwrites the first's buffers with the same values
                    fast_logits = step(x, fast_values)
            assert torch.equal(logits, fast_logits) and torch.equal(values, fast_values[:, 0])
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ["cartpole", "gridworld"])
def test_forward_function_gives_forwards_bits_and_gradients(env_id):
    env = vector.make(env_id, 8, backend="numba", seed=0)
    try:
        rows = [torch.as_tensor(env.reset(seed=s)[0]) for s in range(3)]
        x = torch.stack(rows, 1)  # (B, T, ...): 8 rows over 3 steps
        for policy in _policies(env):
            forward = policy.forward_function(x)
            assert forward is not None
            def outputs_and_gradients(run):
                policy.zero_grad()
                logits, values = run()
                (logits.square().sum() + values.sum()).backward()
                return logits.detach(), values.detach(), [p.grad.clone() for p in policy.parameters()]

            a = outputs_and_gradients(lambda: policy.forward(x)[:2])
            b = outputs_and_gradients(lambda: forward(x))
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
            assert all(torch.equal(g, h) for g, h in zip(a[2], b[2]))
    finally:
        env.close()


def test_step_function_refuses_what_it_would_skip():
    env = vector.make("cartpole", 4, backend="numba", seed=0)
    try:
        x = torch.as_tensor(env.reset(seed=0)[0])
        assert Policy.from_env(env, network="lstm", hidden=16).step_function(x) is None
        assert Policy.from_env(env, network="lstm", hidden=16).forward_function(x[:, None]) is None
        hooked = Policy.from_env(env, hidden=16)
        hooked.encoder.register_forward_hook(lambda *args: None)
        assert hooked.step_function(x) is None and hooked.forward_function(x[:, None]) is None

        class Mine(Policy):
            def forward_eval(self, x, state=(), done=None):
                return super().forward_eval(x, state, done)
        mine = Policy.from_env(env, hidden=16)
        mine.__class__ = Mine
        assert mine.step_function(x) is None
        assert mine.forward_function(x[:, None]) is not None  # forward itself is packrl's
    finally:
        env.close()


@pytest.mark.parametrize("nvec", [(3,), (4, 4), (2, 5)])
def test_step_sampler_draws_what_the_distribution_draws(nvec):
    space = spaces.Discrete(nvec[0]) if len(nvec) == 1 else spaces.MultiDiscrete(nvec)
    spec = ActionSpec(as_action_layout(space))
    sampler = spec.step_sampler(6, torch.device("cpu"))
    if len(set(nvec)) > 1:
        assert sampler is None
        return
    torch.manual_seed(0)
    logits = torch.randn(6, spec.logits_size)
    noise = spec.empty_noise((6,), torch.device("cpu"))
    spec.fill_noise(noise)
    shape = (6,) if isinstance(space, spaces.Discrete) else (6, len(nvec))
    a1, a2 = torch.zeros(shape, dtype=torch.long), torch.zeros(shape, dtype=torch.long)
    l1, l2 = torch.zeros(6), torch.zeros(6)
    view = (lambda a: a.unsqueeze(-1)) if isinstance(space, spaces.Discrete) else (lambda a: a)
    spec.distribution(logits).sample_into(noise, view(a1), l1)
    sampler(logits, noise, view(a2), l2)
    assert torch.equal(a1, a2) and torch.equal(l1, l2)


@pytest.mark.parametrize("env_id", ["cartpole", "gridworld"])
def test_a_run_with_the_fast_forms_equals_one_without(env_id):
    def run(hook: bool):
        env = vector.make(env_id, 8, backend="numba", seed=3)
        try:
            torch.manual_seed(3)
            policy = Policy.from_env(env, hidden=32)
            if hook:
                policy.network.register_forward_pre_hook(lambda *args: None)
            ppo = PPO(env, policy, PPOConfig(num_steps=32, num_minibatches=2, update_epochs=2, device="cpu", seed=3))
            ppo.step.prepare(ppo.storage.views(0).obs)
            assert (ppo.step.step_function is None) == hook
            assert (ppo._training_forward_function(ppo.obs) is None) == hook
            for _ in range(2):
                ppo.collect()
                ppo.update()
            return [t.clone() for t in policy.state_dict().values()], ppo.actions.clone(), ppo.logprobs.clone()
        finally:
            env.close()

    fast, slow = run(False), run(True)
    assert all(torch.equal(a, b) for a, b in zip(fast[0], slow[0]))
    assert torch.equal(fast[1], slow[1]) and torch.equal(fast[2], slow[2])
    assert np.isfinite(fast[2].numpy()).all()
