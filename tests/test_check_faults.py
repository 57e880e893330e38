"""``packrl check`` names the fault under the right check: each test plants one fault in a real env or a real
Policy and asserts that exactly that check fails, naming what is wrong."""
import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from packrl import vector
from packrl.check import CHECKS, check_env, print_report
from packrl.cli import main
from packrl.models import Policy
from packrl.models.networks import LSTM

OBS = gym.spaces.Dict({"pos": gym.spaces.Box(0, 4, (2,), np.int32), "x": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                       "goal": gym.spaces.Discrete(5)})


class Walk(gym.Env):
    """A small structured env; ``fault`` plants a bad observation at step 3 of env 1 (the second one made)."""

    observation_space = OBS
    action_space = gym.spaces.Discrete(3)

    def __init__(self, fault=None, index=0):
        self.fault, self.index, self.t = fault, index, 0
        self.rng = np.random.default_rng(index)

    def _obs(self):
        obs = {"pos": self.rng.integers(0, 5, 2).astype(np.int32), "x": self.rng.uniform(-1, 1, 2).astype(np.float32),
               "goal": int(self.rng.integers(0, 5))}
        if self.index == 1 and self.t == 3:
            if self.fault == "nan":
                obs["x"] = np.array([np.nan, np.nan], np.float32)
            elif self.fault == "int_range":
                obs["pos"] = np.array([1, 9], np.int32)
            elif self.fault == "discrete_range":
                obs["goal"] = 7
        return obs

    def reset(self, seed=None, options=None):
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(action == 1), self.t % 6 == 0, False, {}


def walk_creator(fault=None):
    made = []

    def creator():
        made.append(1)
        return Walk(fault, len(made) - 1)
    return creator


def nan_env():
    """For the command line: every env made plants a NaN at step 3 (env ids call a creator with no state)."""
    return Walk("nan", 1)


@pytest.fixture
def envs(request):
    made = []

    def make(fault=None, n=2, creator=None):
        env = vector.make(creator or walk_creator(fault), n, seed=0)
        made.append(env)
        return env
    yield make
    for env in made:
        env.close()


def policy_for(env, network="mlp", **kwargs):
    torch.manual_seed(0)
    return Policy.from_env(env, network=network, hidden=16, **kwargs)


def failing(report):
    return [check for check, _, _ in report.failures()]


def detail(report, check):
    return report.results[check][1]


def test_a_healthy_env_and_policy_pass_every_check(envs):
    for network in ("mlp", "lstm"):
        env = envs()
        report = check_env(env, policy_for(env, network), steps=12)
        assert report.ok, report.rows
        assert [c for c, _, _ in report.rows] == list(CHECKS)
        expected_skip = ["recurrent state reset at episode starts"] if network == "mlp" else []
        assert [c for c, s, _ in report.rows if s == "skip"] == expected_skip


def test_a_nan_observation_is_named_under_the_observation_check(envs, capsys):
    env = envs("nan")
    report = check_env(env, policy_for(env), steps=8)
    assert failing(report) == ["observation leaves inside their spaces"]
    assert "step 3, env row 1, leaf ['x']: NaN, value [nan nan]" in detail(report, "observation leaves inside their spaces")
    print_report(report)
    out = capsys.readouterr().out
    assert "[nan nan]" in out and "FAIL" in out  # escaped: rich does not eat it as a style tag


@pytest.mark.parametrize("fault,leaf,value", [("int_range", "['pos']", "9"), ("discrete_range", "['goal']", "7")])
def test_an_out_of_range_observation_is_named_under_the_observation_check(envs, fault, leaf, value):
    env = envs(fault)
    report = check_env(env, policy_for(env), steps=8)
    assert failing(report) == ["observation leaves inside their spaces"]
    text = detail(report, "observation leaves inside their spaces")
    assert "step 2, env 1" in text and f"leaf {leaf}" in text and value in text
    # the checks it prevented are listed as skipped, with the reason, not dropped and not blamed
    status, reason = report.results["sampled actions accepted by the env"]
    assert status == "skip" and "observation" in reason
    assert report.results["every parameter influences the loss"][0] == "skip"


def test_a_head_of_the_wrong_width_fails_the_output_shape_check(envs):
    env = envs()
    policy = policy_for(env)
    policy.decoder.actor.discrete = nn.Linear(16, 4)  # 4 logits for a Discrete(3) action
    report = check_env(env, policy, steps=8)
    assert failing(report) == ["policy output shapes"]
    assert "logits (2, 4), the action layout needs (2, 3)" in detail(report, "policy output shapes")
    assert report.results["gradients finite"] == ("skip", "not run: the policy's outputs have the wrong shape")


class FloatCast(Policy):
    """The classic mistake: torch.Tensor(obs) (a float cast) before the policy nativizes the rows."""

    def forward_eval(self, x, state=(), done=None):
        return super().forward_eval(x.float(), state, done)


def test_an_observation_cast_to_float_before_nativize_is_named(envs):
    env = envs()
    policy = policy_for(env)
    policy.__class__ = FloatCast
    report = check_env(env, policy, steps=8)
    assert failing(report) == ["policy reads the packed rows"]
    assert "NativizeError" in detail(report, "policy reads the packed rows")
    assert "float32" in detail(report, "policy reads the packed rows")


def test_padded_rows_leaking_into_the_loss_are_named(envs):
    from pettingzoo.classic import tictactoe_v3

    creator = tictactoe_v3.env
    env = envs(creator=creator, n=2)  # turn-based: the waiting player's row is masked every step
    healthy = check_env(env, policy_for(env), steps=10)
    assert healthy.ok and "padded row-steps" in detail(healthy, "padded rows kept out of the loss")
    assert "stood in" not in detail(healthy, "padded rows kept out of the loss")
    policy = policy_for(env)
    policy.encoder = nn.Sequential(policy.encoder, nn.BatchNorm1d(16))  # batch statistics mix every row
    report = check_env(env, policy, steps=10)
    assert failing(report) == ["padded rows kept out of the loss"]
    assert "changing only the padded rows changed the loss" in detail(report, "padded rows kept out of the loss")


class NoReset(LSTM):
    """An LSTM that ignores ``done``: a row's state runs on into its next episode."""

    def step(self, x, state, done=None):
        return super().step(x, state, None)

    def sequence(self, x, state, done=None):
        return super().sequence(x, state, None)


def test_a_recurrent_state_never_reset_is_named(envs):
    env = envs()
    policy = policy_for(env, "lstm")
    policy.network.__class__ = NoReset
    report = check_env(env, policy, steps=8)
    assert failing(report) == ["recurrent state reset at episode starts"]
    assert "forward_eval: rows whose episode starts" in detail(report, "recurrent state reset at episode starts")


class ZeroedLeaf(nn.Module):
    """A leaf encoder whose output is multiplied by 0: the leaf never influences anything."""

    output_size = 4

    def __init__(self, detach=False):
        super().__init__()
        self.linear, self.detach = nn.Linear(2, 4), detach

    def forward(self, x):
        y = self.linear(x.float())
        return y.detach() if self.detach else y * 0.0


@pytest.mark.parametrize("detached,message", [(False, "gradient exactly zero"), (True, "no gradient (detached")])
def test_a_leaf_with_zero_or_detached_gradient_fails(envs, detached, message):
    env = envs()
    policy = policy_for(env, overrides={("pos",): ZeroedLeaf(detached)})
    report = check_env(env, policy, steps=8)
    assert failing(report) == ["every parameter influences the loss"]
    text = detail(report, "every parameter influences the loss")
    pos = [leaf.path for leaf in env.emulated.observation.leaves].index(("pos",))  # the encoder of leaf ['pos']
    assert message in text and f"encoder.leaf_encoders.{pos}.linear.weight" in text
    assert f"encoder.leaf_encoders.{pos}.linear.bias" in text


def test_the_command_exits_1_and_prints_values_literally(capsys):
    rc = main(["check", "tests.test_check_faults:nan_env", "--num-envs", "2", "--steps", "6"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "[nan nan]" in out and "observation leaves inside" in out and "1 check failed" in out


@pytest.mark.parametrize("steps", ["0", "-3", "many"])
def test_a_bad_steps_flag_is_one_line_and_exit_2(capsys, steps):
    with pytest.raises(SystemExit) as exit_info:
        main(["check", "CartPole-v1", "--steps", steps])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--steps" in err and "positive integer" in err
