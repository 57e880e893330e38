"""packrl.compat.sb3: a packrl vector env as a Stable-Baselines3 VecEnv. SB3 PPO learns CartPole through
it (rl-zoo hyperparameters); a Dict-observation env reaches MultiInputPolicy as a Dict of its exact
leaves (int64 beyond float precision kept in SB3's rollout buffer), with terminal_observation and
TimeLimit.truncated as SB3's own VecEnvs give them; env attributes and refusals."""
import warnings

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy

from packrl import UsageError, vector
from packrl.compat.sb3 import as_sb3
from packrl.vector.testing import ScriptedEnv

BIG_SEED = 2**53 + 1  # not a float64 (nor float32): an int64 leaf that passed through a float would change


def cartpole():
    return gymnasium.make("CartPole-v1")


def test_sb3_ppo_learns_cartpole_through_the_adapter():
    """rl-zoo's CartPole-v1 PPO settings, 32,768 steps (bounded by steps; rl-zoo trains 100k): greedy
    evaluation must reach CartPole-v1's reward threshold of 475 (a random policy gets about 22)."""
    torch.set_num_threads(1)
    env = as_sb3(vector.make(cartpole, 8, seed=0))
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                ent_coef=0.0, learning_rate=lambda f: 1e-3 * f, clip_range=lambda f: 0.2 * f, seed=0, device="cpu")
    model.learn(32_768)
    evaluation = as_sb3(vector.make(cartpole, 4, seed=1000))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SB3 asks for its Monitor wrapper; the episodes are CartPole's own
        mean, _ = evaluate_policy(model, evaluation, n_eval_episodes=8, deterministic=True)
    env.close()
    evaluation.close()
    assert mean >= 475, f"mean greedy return {mean} after 32,768 steps"


def test_dict_observation_reaches_sb3_as_exact_leaves():
    venv = vector.make(ScriptedEnv, 4, seed=BIG_SEED)
    env = as_sb3(venv)
    assert isinstance(env.observation_space, spaces.Dict)
    assert set(env.observation_space) == {"seed", "episode", "t", "last_action", "noise"}
    assert env.observation_space["seed"].dtype == np.int64 and env.observation_space["noise"].dtype == np.float64
    layout = venv.emulated.observation
    obs = env.reset()
    assert obs["seed"].dtype == np.int64 and obs["seed"][:, 0].tolist() == [BIG_SEED + i for i in range(4)]
    ended = {"terminated": 0, "truncated": 0}
    for _ in range(20):
        before, kept = obs, {key: value.copy() for key, value in obs.items()}
        obs, rewards, dones, infos = env.step(np.ones(4, np.int64))
        for key in kept:  # copies: what SB3 keeps is not overwritten by the next step
            np.testing.assert_array_equal(before[key], kept[key])
        native = layout.unpack(venv.observations)
        np.testing.assert_array_equal(obs["noise"], native["noise"])
        np.testing.assert_array_equal(obs["t"], native["t"])
        for i, info in enumerate(infos):
            truncated = bool(venv.truncations[i] and not venv.terminals[i])
            assert info["TimeLimit.truncated"] is truncated
            if dones[i]:
                final = info["terminal_observation"]
                assert final["t"] == before["t"][i] + 1 and final["seed"].tolist() == [BIG_SEED + i]
                assert obs["t"][i] == 0  # the next episode's first observation
                ended["truncated" if truncated else "terminated"] += 1
            else:
                assert "terminal_observation" not in info
    assert ended["terminated"] and ended["truncated"], ended

    # no seed here: SB3 would reseed the envs with 0..3 (as it should); the envs keep the big seeds
    model = PPO("MultiInputPolicy", env, n_steps=16, batch_size=32, n_epochs=1, device="cpu")
    model.learn(64)
    stored = model.rollout_buffer.observations["seed"]
    assert stored.dtype == np.int64
    assert set(stored.reshape(-1).tolist()) == {BIG_SEED + i for i in range(4)}
    env.close()


class MatchEnv(gymnasium.Env):
    """Reward 1 when the action equals the observed Discrete target; a Dict observation with an int16
    distractor. Episodes of 16 steps (truncated)."""

    def __init__(self):
        self.observation_space = spaces.Dict({"target": spaces.Discrete(4),
                                              "distractor": spaces.Box(0, 9, (2,), np.int16)})
        self.action_space = spaces.Discrete(4)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        reward = float(action == self.target)
        self.t += 1
        return self._obs(), reward, False, self.t >= 16, {}

    def _obs(self):
        self.target = int(self.np_random.integers(4))
        return {"target": self.target, "distractor": self.np_random.integers(0, 10, 2).astype(np.int16)}


def test_multi_input_policy_learns_from_the_leaves():
    """The Discrete leaf reaches the policy as a one-hot (not as a byte of a float row): PPO learns to
    match it (random: 0.25 per step)."""
    torch.set_num_threads(1)
    env = as_sb3(vector.make(MatchEnv, 8, seed=0))
    model = PPO("MultiInputPolicy", env, n_steps=32, batch_size=128, n_epochs=4, learning_rate=3e-3, seed=0,
                device="cpu")
    model.learn(8192)
    evaluation = as_sb3(vector.make(MatchEnv, 4, seed=500))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mean, _ = evaluate_policy(model, evaluation, n_eval_episodes=8, deterministic=True)
    assert mean >= 14, f"mean return {mean} of 16"


def test_attributes_through_the_adapter():
    env = as_sb3(vector.make(lambda: gymnasium.make("CartPole-v1", render_mode="rgb_array"), 3))
    env.reset()
    assert env.render_mode == "rgb_array"
    assert env.get_attr("gravity") == [9.8] * 3
    env.set_attr("gravity", 3.0, indices=[1])
    assert env.get_attr("gravity") == [9.8, 3.0, 9.8]
    assert env.get_attr("gravity", indices=[1, 2]) == [3.0, 9.8]
    assert env.env_method("get_wrapper_attr", "force_mag", indices=0) == [10.0]
    from gymnasium.wrappers import TimeLimit
    assert env.env_is_wrapped(TimeLimit) == [True] * 3
    assert env.env_is_wrapped(gymnasium.wrappers.RecordVideo) == [False] * 3
    images = env.get_images()
    assert len(images) == 3 and images[0].ndim == 3
    with pytest.raises(UsageError, match="env_method\\('step'\\)"):
        env.env_method("step", 0)
    env.close()


def test_refused_vector_envs():
    with pytest.raises(UsageError, match="infos='list'"):
        as_sb3(vector.make(cartpole, 2, infos="dict"))
    with pytest.raises(UsageError, match="batch_size=1 < num_envs=2"):
        as_sb3(vector.make(cartpole, 2, batch_size=1))
    with pytest.raises(UsageError, match="observations='rows'"):
        as_sb3(vector.make(cartpole, 2), observations="leaves")
    import minigrid  # noqa: F401 - registers the MiniGrid ids

    minigrid_envs = vector.make(lambda: gymnasium.make("MiniGrid-Empty-5x5-v0"), 2)
    with pytest.raises(UsageError, match="leaf 'mission'.*skip=\\('mission',\\)"):
        as_sb3(minigrid_envs)
    with pytest.raises(UsageError, match="no observation leaf \\['colour'\\]"):
        as_sb3(minigrid_envs, skip=("colour",))
    env = as_sb3(minigrid_envs, skip=("mission",))
    assert set(env.observation_space) == {"image", "direction"}
    assert env.reset()["image"].dtype == np.uint8
    env.close()
    with pytest.raises(UsageError, match="as_sb3 takes a packrl vector env"):
        as_sb3(gymnasium.make("CartPole-v1"))

    class ShiftedDiscrete(ScriptedEnv):
        def __init__(self):
            super().__init__()
            self.observation_space = spaces.Dict({**self.observation_space.spaces, "t": spaces.Discrete(16, start=1)})

    with pytest.raises(UsageError, match="observation leaf 't'.*start=1"):
        as_sb3(vector.make(ShiftedDiscrete, 2))


# ------------------------------------------------------------ multi-agent envs: one SB3 env per agent row


def spread():
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=False)


def zombies():
    """Knights, archers and zombies: agents die when a zombie reaches them (early, with spawn_delay=5)."""
    from pettingzoo.butterfly import knights_archers_zombies_v11

    return knights_archers_zombies_v11.parallel_env(spawn_delay=5)


def supersuit_recipe(creator, num_envs, black_death=False):
    """SuperSuit's two lines (``pettingzoo_env_to_vec_env_v1`` + ``concat_vec_envs_v1``), SB3 form."""
    import supersuit

    env = supersuit.black_death_v3(creator()) if black_death else creator()
    return supersuit.concat_vec_envs_v1(supersuit.pettingzoo_env_to_vec_env_v1(env), num_envs, num_cpus=0,
                                        base_class="stable_baselines3")


def test_parallel_env_matches_supersuits_recipe_step_for_step():
    """Same seeds: observations, rewards, dones and terminal observations equal SuperSuit's at every step,
    over several episode ends (simple_spread ends every agent at once, by truncation at 25 steps)."""
    ref, env = supersuit_recipe(spread, 3), as_sb3(vector.make(spread, 3, seed=7))
    assert env.num_envs == ref.num_envs == 9
    assert env.observation_space == ref.observation_space and env.action_space == ref.action_space
    expected, _ = ref.venv.reset(seed=7)  # SuperSuit's SB3 wrapper cannot seed (its ConcatVecEnv has no seed())
    env.seed(7)
    np.testing.assert_array_equal(env.reset(), expected)
    rng, ends = np.random.default_rng(0), 0
    for _ in range(80):
        actions = rng.integers(0, 5, env.num_envs)
        want, got = ref.step(actions), env.step(actions)
        for name, a, b in zip(("observations", "rewards", "dones"), want[:3], got[:3]):
            np.testing.assert_array_equal(b, a.astype(b.dtype), err_msg=name)
        for i in np.flatnonzero(got[2]):
            np.testing.assert_array_equal(got[3][i]["terminal_observation"], want[3][i]["terminal_observation"])
            assert got[3][i]["TimeLimit.truncated"] is True
            ends += 1
    assert ends == 9 * 3


def test_gone_agents_read_zeros_as_black_death_gives():
    """Against SuperSuit's black_death_v3 recipe on knights-archers-zombies, until the first episode end
    (black_death_v3 ends an env only when every agent is both terminated and truncated, so past that
    point it steps an env with no agents): observations and rewards equal, except that packrl reports
    the dying agent's end on its step (done, with its last observation as terminal_observation) where
    black_death hides it; from then on that row is zeros with reward 0 and never done again."""
    ref, venv = supersuit_recipe(zombies, 2, black_death=True), vector.make(zombies, 2, seed=3)
    env = as_sb3(venv)
    expected, _ = ref.venv.reset(seed=3)
    env.seed(3)
    np.testing.assert_array_equal(env.reset(), expected)
    rng, gone, zero_steps = np.random.default_rng(0), set(), 0
    for _ in range(900):
        actions = rng.integers(0, 6, env.num_envs)
        (ref_obs, ref_rewards, ref_dones, _), (obs, rewards, dones, infos) = ref.step(actions), env.step(actions)
        np.testing.assert_array_equal(rewards, ref_rewards)
        if any(all(dones[r] or r in gone for r in range(e * 4, e * 4 + 4)) for e in (0, 1)):
            break  # an episode ended: past here black_death_v3 steps an env without agents
        assert not ref_dones.any()
        for row in range(env.num_envs):
            if dones[row]:  # the agent died at this step: its end reported once, its row zeros
                assert row not in gone
                np.testing.assert_array_equal(infos[row]["terminal_observation"], ref_obs[row])
                assert infos[row]["TimeLimit.truncated"] is False and not obs[row].any()
                gone.add(row)
            elif row in gone:
                assert not obs[row].any() and rewards[row] == 0 and not ref_obs[row].any()
                zero_steps += 1
            else:
                np.testing.assert_array_equal(obs[row], ref_obs[row])
    assert gone and zero_steps, (gone, zero_steps)


def test_gone_agents_come_back_when_their_env_resets():
    """After the episode ends (every agent gone), each row gets the next episode's first observation."""
    venv = vector.make(zombies, 1, seed=11)
    env = as_sb3(venv)
    obs, rng = env.reset(), np.random.default_rng(1)
    done_count, finished = np.zeros(4, int), False
    for _ in range(2000):
        obs, rewards, dones, infos = env.step(rng.integers(0, 6, 4))
        done_count += dones
        if (done_count >= 1).all() and dones.any():  # the step that ended the episode
            assert all(obs[row].any() for row in range(4)), "every row holds the new episode's first observation"
            finished = True
            break
    assert finished and (done_count == 1).all(), done_count  # each agent's end reported exactly once


def test_tuple_agents_env_as_sb3_rows():
    """emulate(env, agents="tuple") (lbforaging): one row per agent, the env's info under each row."""
    import lbforaging  # noqa: F401 - registers Foraging-*

    from packrl.emulation import emulate

    creator = lambda: emulate(gymnasium.make("Foraging-8x8-2p-1f-v3"), agents="tuple")  # noqa: E731
    raws = [gymnasium.make("Foraging-8x8-2p-1f-v3") for _ in range(2)]
    env = as_sb3(vector.make(creator, 2, seed=5))
    assert env.num_envs == 4
    obs = env.reset()
    for e, raw in enumerate(raws):
        np.testing.assert_array_equal(obs[2 * e: 2 * e + 2], np.stack(raw.reset(seed=5 + e)[0]))
    rng = np.random.default_rng(2)
    for _ in range(60):
        actions = rng.integers(0, env.action_space.n, 4)
        obs, rewards, dones, infos = env.step(actions)
        for e, raw in enumerate(raws):
            raw_obs, raw_rewards, term, trunc, raw_info = raw.step(tuple(int(a) for a in actions[2 * e: 2 * e + 2]))
            np.testing.assert_array_equal(rewards[2 * e: 2 * e + 2], np.float32(raw_rewards))
            assert dones[2 * e: 2 * e + 2].tolist() == [term or trunc] * 2
            for row in (2 * e, 2 * e + 1):
                assert {k: v for k, v in infos[row].items() if k not in ("TimeLimit.truncated", "terminal_observation")} \
                    == {k: v for k, v in raw_info.items()}
            if term or trunc:
                raw_obs, _ = raw.reset()
            np.testing.assert_array_equal(obs[2 * e: 2 * e + 2], np.stack(raw_obs))
    env.close()


def test_multi_agent_attributes_map_rows_to_their_env():
    env = as_sb3(vector.make(spread, 2))
    assert env.get_attr("possible_agents") == [["agent_0", "agent_1", "agent_2"]] * 6
    env.set_attr("label", "a", indices=[0])
    env.set_attr("label", "b", indices=[4])  # row 4 is agent_1 of env 1
    assert env.get_attr("label") == ["a", "a", "a", "b", "b", "b"]
    assert env.get_attr("label", indices=[5, 0]) == ["b", "a"]
    with pytest.raises(UsageError, match="indices: 6 is not an env"):
        env.get_attr("label", indices=[6])
    env.close()


def test_refused_multi_agent_envs():
    from mpe2 import simple_adversary_v3, simple_world_comm_v3
    from pettingzoo.classic import tictactoe_v3

    with pytest.raises(UsageError, match="agents 'adversary_0' and 'agent_0' differ in observation space "
                                         "Box\\(-inf, inf, \\(8,\\), float32\\) vs Box\\(-inf, inf, \\(10,\\)"):
        as_sb3(vector.make(lambda: simple_adversary_v3.parallel_env(), 2))
    with pytest.raises(UsageError, match="agents 'leadadversary_0' and 'adversary_0' differ in action space "
                                         "Discrete\\(20\\) vs Discrete\\(5\\); SB3 rows share"):
        as_sb3(vector.make(lambda: simple_world_comm_v3.parallel_env(), 1))
    with pytest.raises(UsageError, match="AEC env \\(pettingzoo.classic.tictactoe.tictactoe.raw_env\\), emulated "
                                         "turn by turn"):
        as_sb3(vector.make(lambda: tictactoe_v3.env(), 2))


class RandomPolicy:
    """evaluate_policy's interface: uniform random actions, a fresh draw every call."""

    def __init__(self, n, seed):
        self.n, self.rng = n, np.random.default_rng(seed)

    def predict(self, obs, state=None, episode_start=None, deterministic=False):
        return self.rng.integers(0, self.n, len(obs)), None


@pytest.mark.slow
def test_sb3_ppo_learns_a_pettingzoo_parallel_env():
    """SB3 PPO on MPE's simple_spread (3 agents, one shared policy, 8 envs = 24 rows), 65,536 agent steps
    (60-100 s on 2 shared cores): its greedy per-agent episode return beats a random policy's, measured on
    the same evaluation envs, by 3 or more (measured: random -24.9, learned -19.9; single episodes spread by
    about 7, so over 96 episodes each mean has a standard error of about 0.7 and 3 is about 3 standard errors
    of the difference)."""
    torch.set_num_threads(1)
    env = as_sb3(vector.make(spread, 8, seed=0))
    model = PPO("MlpPolicy", env, n_steps=64, batch_size=256, n_epochs=10, learning_rate=1e-3, gamma=0.95,
                ent_coef=0.0, seed=0, device="cpu")
    evaluation = as_sb3(vector.make(spread, 4, seed=1000))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SB3 asks for its Monitor wrapper; the episodes are MPE's own
        random_mean, _ = evaluate_policy(RandomPolicy(5, 0), evaluation, n_eval_episodes=96)
        model.learn(65_536)
        learned_mean, _ = evaluate_policy(model, evaluation, n_eval_episodes=96, deterministic=True)
    env.close()
    evaluation.close()
    assert learned_mean >= random_mean + 3, f"learned {learned_mean}, random {random_mean}"
