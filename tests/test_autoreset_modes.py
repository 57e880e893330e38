"""autoreset_mode= on packrl's vector envs (serial, multiprocessing), against gymnasium's SyncVectorEnv.

NEXT_STEP: gymnasium's observation wrappers (NormalizeObservation, TransformObservation) and
RecordEpisodeStatistics over packrl give exactly what they give over SyncVectorEnv (CartPole, and a Dict env
whose rows are unpacked by the Layout); any seeds, env counts and actions give SyncVectorEnv's steps (hypothesis).
DISABLED: reset(options={"reset_mask": ...}) as SyncVectorEnv takes it; stepping an ended env is refused by
index. Multi-agent envs reset all their rows together. Bad modes and options are one-line UsageErrors.
"""
import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers.vector import NormalizeObservation, RecordEpisodeStatistics, TransformObservation
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pettingzoo import ParallelEnv

from packrl import UsageError, vector
from packrl.emulation import Layout
from packrl.vector.testing import ScriptedEnv

BACKENDS = ["serial", "multiprocessing"]
NUM_ENVS = 4
STEPS = 150
SCRIPTED = Layout.from_space(ScriptedEnv().observation_space)


def cartpole():
    return gym.make("CartPole-v1")


def make(backend, creator, num_envs=NUM_ENVS, **kw):
    if backend == "multiprocessing":  # one worker and the main process: both runners step envs
        kw = {"num_workers": 1, "context": "fork", **kw}
    return vector.make(creator, num_envs, backend=backend, **kw)


def flat(tree):
    """A batched Dict observation as float64 rows (leaves in key order), for NormalizeObservation."""
    return np.concatenate([np.asarray(tree[k], np.float64).reshape(len(tree[k]), -1) for k in sorted(tree)], axis=1)


def stack(env, unpack):
    """CleanRL's observation stack (normalize, clip) plus episode statistics; a Dict env is flattened first
    (packrl's rows unpacked by the Layout, SyncVectorEnv's dict as it is)."""
    if unpack is not None:
        single = spaces.Box(-np.inf, np.inf, (6,), np.float64)
        env = TransformObservation(env, lambda obs: flat(unpack(obs)),
                                   observation_space=spaces.Box(-np.inf, np.inf, (env.num_envs, 6), np.float64),
                                   single_observation_space=single)
    env = TransformObservation(NormalizeObservation(env), lambda obs: np.clip(obs, -3.0, 3.0))
    return RecordEpisodeStatistics(env, stats_key="stats")  # ScriptedEnv's reset infos use "episode"


def assert_same_infos(ours, theirs, where):
    assert set(ours) == set(theirs), f"{where}: info keys {sorted(ours)} != {sorted(theirs)}"
    for key, value in theirs.items():
        if where.endswith("/stats") and key == "t":  # RecordEpisodeStatistics' wall-clock time
            continue
        if isinstance(value, dict):
            assert_same_infos(ours[key], value, f"{where}/{key}")
        else:
            assert ours[key].dtype == value.dtype, f"{where}: {key}"
            np.testing.assert_allclose(ours[key], value, rtol=1e-6, err_msg=f"{where}: {key}")


def native(obs, creator):
    return obs if creator is cartpole else SCRIPTED.unpack(np.asarray(obs))


def assert_same_obs(ours, theirs, where):
    if isinstance(theirs, dict):
        for key in theirs:
            np.testing.assert_array_equal(ours[key], theirs[key], err_msg=f"{where}: {key}")
    else:
        np.testing.assert_array_equal(ours, theirs, err_msg=where)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("creator", [cartpole, ScriptedEnv], ids=["CartPole", "ScriptedDict"])
def test_observation_wrappers_over_next_step_equal_sync(backend, creator):
    unpack = None if creator is cartpole else SCRIPTED.unpack
    ours = stack(make(backend, creator, infos="dict", autoreset_mode="NEXT_STEP"), unpack)
    theirs = stack(SyncVectorEnv([creator] * NUM_ENVS, autoreset_mode=AutoresetMode.NEXT_STEP),
                   None if creator is cartpole else (lambda obs: obs))
    rng = np.random.default_rng(5)
    ends = 0
    try:
        obs, info = ours.reset(seed=21)
        sync_obs, sync_info = theirs.reset(seed=21)
        np.testing.assert_array_equal(obs, sync_obs)
        assert_same_infos(info, sync_info, "reset")
        for t in range(STEPS):
            actions = rng.integers(0, ours.single_action_space.n, NUM_ENVS)
            obs, rew, term, trunc, info = ours.step(actions)
            sync_obs, sync_rew, sync_term, sync_trunc, sync_info = theirs.step(actions)
            where = f"{creator.__name__} on {backend}, step {t}"
            np.testing.assert_array_equal(obs, sync_obs, err_msg=where)
            np.testing.assert_allclose(rew, sync_rew, rtol=1e-6, err_msg=where)
            np.testing.assert_array_equal(term, sync_term, err_msg=where)
            np.testing.assert_array_equal(trunc, sync_trunc, err_msg=where)
            assert_same_infos(info, sync_info, where)
            ends += int((term | trunc).sum())
        assert ends >= 8, f"only {ends} episode ends: the comparison saw too few"
        np.testing.assert_allclose(list(ours.return_queue), list(theirs.return_queue), rtol=1e-6)
        assert list(ours.length_queue) == list(theirs.length_queue)
        assert ours.env.env.obs_rms.count == theirs.env.env.obs_rms.count  # the reset steps were normalized too
    finally:
        ours.close()
        theirs.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**20), num_envs=st.integers(1, 4), infos=st.sampled_from(["list", "dict"]),
       steps=st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 15)), min_size=1, max_size=40))
def test_any_seeds_and_actions_give_sync_next_step(seed, num_envs, infos, steps):
    """Whatever the seeds (episode lengths), env count and actions, each step equals SyncVectorEnv's under
    NEXT_STEP, infos included (the reset step's info is its reset info); ``ended_envs`` is the envs that
    will reset at the next step."""
    ours = vector.make(ScriptedEnv, num_envs, infos=infos, autoreset_mode=AutoresetMode.NEXT_STEP)
    theirs = SyncVectorEnv([ScriptedEnv] * num_envs, autoreset_mode=AutoresetMode.NEXT_STEP)
    try:
        ours.reset(seed=seed)
        theirs.reset(seed=seed)
        for t, (bits, _) in enumerate(steps):
            actions = np.array([(bits >> (2 * i)) % 3 for i in range(num_envs)])
            obs, rew, term, trunc, info = ours.step(actions)
            sync_obs, sync_rew, sync_term, sync_trunc, sync_info = theirs.step(actions)
            assert_same_obs(SCRIPTED.unpack(obs), sync_obs, f"step {t}")
            np.testing.assert_allclose(rew, sync_rew, rtol=1e-6)
            np.testing.assert_array_equal(term, sync_term)
            np.testing.assert_array_equal(trunc, sync_trunc)
            np.testing.assert_array_equal(ours.ended_envs, theirs._autoreset_envs)
            if infos == "dict":
                assert_same_infos(info, sync_info, f"step {t}")
            else:
                assert [bool(i) for i in info] == [bool(sync_info.get("_episode", np.zeros(num_envs))[i])
                                                   for i in range(num_envs)]
    finally:
        ours.close()
        theirs.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**20), num_envs=st.integers(1, 4),
       steps=st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 15), st.none() | st.integers(0, 2**20)),
                      min_size=1, max_size=40))
def test_disabled_with_reset_masks_gives_sync_disabled(seed, num_envs, steps):
    """DISABLED: after each step the ended envs, and any others the draw picks, are reset with a reset mask
    (with a new seed or none) on both sides; observations, rewards, flags and reset infos equal SyncVectorEnv's."""
    ours = vector.make(ScriptedEnv, num_envs, infos="dict", autoreset_mode="Disabled")
    theirs = SyncVectorEnv([ScriptedEnv] * num_envs, autoreset_mode=AutoresetMode.DISABLED)
    try:
        ours.reset(seed=seed)
        theirs.reset(seed=seed)
        for t, (bits, extra, reseed) in enumerate(steps):
            actions = np.array([(bits >> (2 * i)) % 3 for i in range(num_envs)])
            obs, rew, term, trunc, _ = ours.step(actions)
            sync_obs, sync_rew, sync_term, sync_trunc, _ = theirs.step(actions)
            assert_same_obs(SCRIPTED.unpack(obs), sync_obs, f"step {t}")
            np.testing.assert_allclose(rew, sync_rew, rtol=1e-6)
            np.testing.assert_array_equal(term | trunc, ours.ended_envs)
            mask = (term | trunc) | np.array([bool(extra >> i & 1) for i in range(num_envs)])
            if mask.any():
                obs, info = ours.reset(seed=reseed, options={"reset_mask": mask})
                sync_obs, sync_info = theirs.reset(seed=reseed, options={"reset_mask": mask.copy()})
                assert_same_obs(SCRIPTED.unpack(obs), sync_obs, f"reset after step {t}")
                assert_same_infos(info, sync_info, f"reset after step {t}")
                assert not ours.ended_envs.any()
    finally:
        ours.close()
        theirs.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_disabled_refuses_an_ended_env_by_index_and_stays_usable(backend):
    env = make(backend, ScriptedEnv, autoreset_mode=AutoresetMode.DISABLED)
    try:
        env.reset(seed=0)  # env i's first episode lasts 3 + i % 4 steps: env 0 ends first, at step 3
        zeros = np.zeros(NUM_ENVS, np.int64)
        for _ in range(3):
            _, _, term, trunc, _ = env.step(zeros)
        assert list(term | trunc) == [True, False, False, False]
        with pytest.raises(UsageError, match=r"env 0's episode ended at its last step and autoreset_mode is "
                                             r"DISABLED: reset it with reset\(options=\{'reset_mask'"):
            env.step(zeros)
        first_episode = env.observations.copy()
        obs, infos = env.reset(options={"reset_mask": np.array([True, False, False, False])})
        np.testing.assert_array_equal(obs[1:], first_episode[1:])  # the others keep their rows
        assert SCRIPTED.unpack(obs)["t"][0] == 0 and SCRIPTED.unpack(obs)["episode"][0] == 1
        _, _, term, trunc, _ = env.step(zeros)  # usable: nothing was stepped by the refused call
        assert list(term | trunc) == [False, True, False, False]
        assert SCRIPTED.unpack(env.observations)["t"].tolist() == [1, 4, 4, 4]
        # env 1 ended; reset with env 3 (multiprocessing: env 1 is the worker's, env 3 the main process's)
        obs, _ = env.reset(options={"reset_mask": np.array([False, True, False, True])})
        assert SCRIPTED.unpack(obs)["t"].tolist() == [1, 0, 4, 0]
        _, _, term, trunc, _ = env.step(zeros)
        assert SCRIPTED.unpack(env.observations)["t"].tolist() == [2, 1, 5, 1] and list(term | trunc)[2]
        obs, _ = env.reset(options={"reset_mask": np.array([False, False, True, False])})  # no worker's env
        assert SCRIPTED.unpack(obs)["t"].tolist() == [2, 1, 0, 1]
        env.step(zeros)
        assert SCRIPTED.unpack(env.observations)["t"].tolist() == [3, 2, 1, 2]
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_metadata_tells_the_mode_and_gymnasium_observation_wrappers_read_it(backend, mode):
    env = make(backend, cartpole, 2, autoreset_mode=mode.name)
    try:
        assert env.metadata["autoreset_mode"] is mode and env.autoreset_mode is mode
        # gymnasium's own rules: observation wrappers refuse SAME_STEP; NormalizeObservation wants NEXT_STEP
        if mode == AutoresetMode.SAME_STEP:
            with pytest.raises(ValueError, match="Expected autoreset_mode to be NEXT_STEP or DISABLED"):
                TransformObservation(env, lambda obs: obs)
        else:
            TransformObservation(env, lambda obs: obs).reset(seed=0)
        if mode == AutoresetMode.NEXT_STEP:
            NormalizeObservation(env).reset(seed=0)
        else:
            with pytest.raises(ValueError, match="Expected"):
                NormalizeObservation(env)
    finally:
        env.close()
    assert vector.VectorEnv.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP  # the class default is untouched


def test_bad_modes_backends_and_reset_options_are_one_line_usage_errors():
    with pytest.raises(UsageError, match=r"autoreset_mode='next' *: choose gymnasium.vector.AutoresetMode"):
        vector.make(cartpole, 2, autoreset_mode="next")
    for backend in ("numba", "ray"):
        with pytest.raises(UsageError, match=f"autoreset_mode=NEXT_STEP: backend '{backend}' offers SAME_STEP only"):
            vector.make("cartpole" if backend == "numba" else cartpole, 2, backend=backend, autoreset_mode="NEXT_STEP")
    with pytest.raises(UsageError, match="autoreset_mode=DISABLED needs batch_size == num_envs"):
        vector.make(cartpole, 4, batch_size=2, autoreset_mode="DISABLED")
    numba_env = vector.make("cartpole", 2, backend="numba")
    with pytest.raises(UsageError, match="envs that reset themselves"):
        vector.make(lambda: numba_env, 1, autoreset_mode="NEXT_STEP")
    with vector.make(cartpole, 2, autoreset_mode="DISABLED") as env:
        with pytest.raises(UsageError, match="before the first reset"):
            env.reset(options={"reset_mask": np.ones(2, bool)})
        env.reset(seed=0)
        for options, message in [({"reset_mask": np.ones(3, bool)}, r"shape \(2,\)"),
                                 ({"reset_mask": np.ones(2, np.int64)}, "numpy bool array"),
                                 ({"reset_mask": [True, True]}, "got a list"),
                                 ({"reset_mask": np.zeros(2, bool)}, "resets no env"),
                                 ({"reset_mask": np.ones(2, bool), "x": 1}, r"only, got \['reset_mask', 'x'\]")]:
            with pytest.raises(UsageError, match=message) as err:
                env.reset(options=options)
            assert "\n" not in str(err.value)
        env.step(np.zeros(2, np.int64))  # still usable


class Staggered(ParallelEnv):
    """Two agents: "a" terminates after 2 steps, "b" after 4 (the episode's end); observations count steps."""

    metadata = {"name": "staggered"}
    possible_agents = ["a", "b"]

    def observation_space(self, agent):
        return spaces.Box(0, 100, (1,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        self.episode = getattr(self, "episode", -1) + 1
        return {a: self._obs() for a in self.agents}, {a: {} for a in self.agents}

    def _obs(self):
        return np.array([10 * self.episode + self.t], np.float32)

    def step(self, actions):
        self.t += 1
        ends = {a: (a == "a" and self.t == 2) or self.t == 4 for a in self.agents}
        out = ({a: self._obs() for a in self.agents}, {a: 1.0 for a in self.agents}, ends,
               {a: False for a in self.agents}, {a: {} for a in self.agents})
        self.agents = [a for a in self.agents if not ends[a]]
        return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_multi_agent_rows_of_an_env_reset_together(backend):
    """NEXT_STEP over a PettingZoo env: an agent that ends mid-episode is masked as in SAME_STEP; the step that
    ends the episode shows each ending agent's final observation; the next step resets both rows (reward 0,
    flags false, both unmasked). Without the reset steps, the rows are SAME_STEP's."""
    def run(mode, steps):
        env = make(backend, Staggered, 2, autoreset_mode=mode)
        env.reset(seed=0)
        out = []
        for _ in range(steps):
            obs, rew, term, trunc, _ = env.step(np.zeros(4, np.int64))
            ends = term | trunc
            out.append((obs.reshape(-1).copy(), rew.copy(), ends.copy(), env.masks.copy(),
                        np.where(ends, env.final_observations.reshape(-1), obs.reshape(-1)), env.ended_envs))
        env.close()
        return out

    same, nxt = run("SAME_STEP", 8), run("NEXT_STEP", 10)
    t2_obs, _, t2_ends, t2_masks, _, _ = nxt[1]
    assert list(t2_ends) == [True, False] * 2 and list(t2_masks) == [False, True] * 2 and list(t2_obs) == [0, 2] * 2
    end_obs, _, end_flags, _, _, end_envs = nxt[3]
    assert list(end_flags) == [False, True] * 2 and list(end_obs) == [0, 4] * 2 and list(end_envs) == [True, True]
    reset_obs, reset_rew, reset_flags, reset_masks, _, reset_envs = nxt[4]
    assert list(reset_obs) == [10] * 4 and not reset_rew.any() and not reset_flags.any() and reset_masks.all()
    assert not reset_envs.any()
    # SAME_STEP's steps are NEXT_STEP's without its reset steps (steps 5 and 10); final observations alike
    kept = [s for t, s in enumerate(nxt) if t not in (4, 9)]
    for t, (mine, theirs) in enumerate(zip(kept, same)):
        np.testing.assert_array_equal(mine[1], theirs[1], err_msg=f"rewards {t}")
        np.testing.assert_array_equal(mine[2], theirs[2], err_msg=f"ends {t}")
        rows = mine[2] | mine[3]  # rows that ended (their final observation) or act next
        np.testing.assert_array_equal(mine[4][rows], theirs[4][rows], err_msg=f"next observations {t}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_next_step_in_batches_gives_each_env_its_own_sync_stream(backend):
    """batch_size < num_envs: each env's stream (its batches' steps) equals a one-env SyncVectorEnv under
    NEXT_STEP seeded as that env, fed the same actions."""
    kw = {"num_workers": 2, "context": "fork"} if backend == "multiprocessing" else {}
    env = vector.make(ScriptedEnv, 4, backend=backend, batch_size=2, autoreset_mode="NEXT_STEP", **kw)
    refs = [SyncVectorEnv([ScriptedEnv], autoreset_mode=AutoresetMode.NEXT_STEP) for _ in range(4)]
    try:
        env.async_reset(seed=7)
        for i, ref in enumerate(refs):
            ref.reset(seed=7 + i)
        rng, seen, sent = np.random.default_rng(0), 0, {}
        for t in range(60):
            batch = env.recv()  # multiprocessing: whichever worker finished first
            for k, i in enumerate(batch.env_ids.tolist()):
                if i in sent:  # else this is the env's reset
                    obs, rew, term, trunc, _ = refs[i].step(sent[i])
                    assert_same_obs({key: v[k] for key, v in SCRIPTED.unpack(batch.observations).items()},
                                    {key: v[0] for key, v in obs.items()}, f"env {i}, batch {t}")
                    assert (batch.rewards[k], batch.terminals[k], batch.truncations[k]) == \
                        (np.float32(rew[0]), term[0], trunc[0]), f"env {i}, batch {t}"
                    seen += int(term[0] or trunc[0])
            actions = rng.integers(0, 3, 2)
            sent.update({int(i): actions[k: k + 1] for k, i in enumerate(batch.env_ids)})
            env.send(actions)
        assert seen >= 8
    finally:
        env.close()


# ---------------------------------------------------------------- PPO under each mode

class Tick(gym.Env):
    """Actions change nothing, so every mode sees the same episodes whatever the policy samples. The
    observation is (step, episode); reward 1 + step / 10; even episodes terminate after 3 + episode % 3 steps,
    odd ones run into the TimeLimit (truncated, bootstrapped)."""

    observation_space = spaces.Box(0.0, 100.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.episode = seed % 5 if seed is not None else self.episode + 1
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return np.array([self.t, self.episode], np.float32)

    def step(self, action):
        self.t += 1
        terminated = self.episode % 2 == 0 and self.t >= 3 + self.episode % 3
        return self._obs(), 1.0 + self.t / 10, terminated, False, {}


def tick():
    return gym.wrappers.TimeLimit(Tick(), max_episode_steps=7)


def ppo_rollouts(mode, network, rollouts=2, steps=24, creator=tick):
    """Each rollout's storage on 3 serial envs (Tick by default), and its advantages, for one policy (no update)."""
    import torch

    from packrl.models import Policy
    from packrl.train.ppo import PPO, PPOConfig

    env = vector.make(creator, 3, seed=0, autoreset_mode=mode)
    torch.manual_seed(0)
    ppo = PPO(env, Policy.from_env(env, network=network, hidden=16), PPOConfig(num_steps=steps, seed=0))
    out = []
    for _ in range(rollouts):
        ppo.collect()
        advantages, _ = ppo.advantages()
        out.append({"obs": ppo.obs.clone(), "masks": ppo.train_masks.clone(), "rewards": ppo.rewards.clone(),
                    "terminals": ppo.terminals.clone(), "truncations": ppo.truncations.clone(),
                    "starts": ppo.starts.clone(), "values": ppo.values.clone(), "final_values": ppo.final_values.clone(),
                    "advantages": advantages.clone(), "agent_steps": ppo.global_step})
    env.close()
    return out


def row_steps(rollout, row):
    """The row's decisions in order: (obs, reward, terminal, truncation, value, advantage, final value)."""
    keep = rollout["masks"][:, row]
    return [tuple(rollout[k][:, row][keep][i].tolist() for k in
                  ("obs", "rewards", "terminals", "truncations", "values", "advantages", "final_values"))
            for i in range(int(keep.sum()))]


@pytest.mark.parametrize("network", ["mlp", "lstm"])
def test_ppo_next_step_bootstraps_as_same_step(network):
    """NEXT_STEP's reset steps are masked out of the loss and transparent to the advantage chain: without them,
    each row's decisions are SAME_STEP's (observations, rewards, ends), across the rollout boundary too, and
    the advantages and truncations' final values of every episode that ended inside the rollout are SAME_STEP's.
    DISABLED (PPO resets the ended envs itself) stores exactly what SAME_STEP stores."""
    same, nxt, off = (ppo_rollouts(mode, network) for mode in ("SAME_STEP", "NEXT_STEP", "DISABLED"))
    for a, b in zip(same, off):
        for key in a:
            assert (a[key] == b[key]).all() if key != "agent_steps" else a[key] == b[key], key
    resets = int((~nxt[0]["masks"]).sum())
    assert resets >= 6 and nxt[0]["agent_steps"] == 3 * 24 - resets  # reset steps are no agent steps
    assert same[0]["truncations"].any() and same[0]["terminals"].any()
    for row in range(3):
        mine = row_steps(nxt[0], row) + row_steps(nxt[1], row)
        theirs = row_steps(same[0], row) + row_steps(same[1], row)
        assert [s[:4] for s in mine] == [s[:4] for s in theirs[:len(mine)]], row
        first = row_steps(nxt[0], row)
        last_end = max(i for i, s in enumerate(first) if s[2] or s[3])
        for i in range(last_end + 1):  # episodes complete inside both first rollouts: their chains are cut there
            np.testing.assert_allclose(first[i][4:], theirs[i][4:], rtol=1e-5, atol=1e-6, err_msg=f"row {row}, {i}")


def test_ppo_multi_agent_rows_match_same_step_in_every_mode():
    """Staggered (two agents, one ending mid-episode; actions change nothing): NEXT_STEP's decisions per row are
    SAME_STEP's without the reset steps, with the same advantages over complete episodes; DISABLED's are
    SAME_STEP's exactly."""
    same, nxt, off = (ppo_rollouts(mode, "mlp", rollouts=1, steps=20, creator=Staggered)[0]
                      for mode in ("SAME_STEP", "NEXT_STEP", "DISABLED"))
    for row in range(6):
        mine, theirs = row_steps(nxt, row), row_steps(same, row)
        assert row_steps(off, row) == theirs, row
        last_end = max(i for i, s in enumerate(mine) if s[2] or s[3])
        assert [s[:4] for s in mine] == [s[:4] for s in theirs[:len(mine)]], row
        np.testing.assert_allclose([s[4:] for s in mine[:last_end + 1]], [s[4:] for s in theirs[:last_end + 1]],
                                   rtol=1e-5, atol=1e-6, err_msg=f"row {row}")
    assert nxt["agent_steps"] < same["agent_steps"] == off["agent_steps"]


def test_ppo_without_the_reset_mask_would_train_on_reset_steps():
    """The check above can fail: NEXT_STEP's masked reset steps are there, and unmasked they would be
    decisions whose next observation is another episode's."""
    nxt = ppo_rollouts("NEXT_STEP", "mlp", rollouts=1)[0]
    reset_steps = ~nxt["masks"]
    assert reset_steps.any() and not nxt["rewards"][reset_steps].any()
    assert not (nxt["terminals"] | nxt["truncations"])[reset_steps].any()
    assert not nxt["starts"][reset_steps].any()  # the final observation starts nothing: the step after it does
    assert nxt["starts"][1:][reset_steps[:-1]].all()


@pytest.mark.parametrize("mode", ["NEXT_STEP", "DISABLED"])
def test_ppo_truncation_learns_the_infinite_horizon_value_in_every_mode(mode):
    """tests/test_ppo.py's Alive env (reward 1, only a TimeLimit ends episodes): with gamma 0.9 the value is
    10 when truncations bootstrap, about 4.5 if they were treated as ends."""
    import torch

    from packrl.models import Policy
    from packrl.train.ppo import PPO, PPOConfig
    from tests.test_ppo import Alive

    env = vector.make(lambda: gym.wrappers.TimeLimit(Alive(), max_episode_steps=8), 4, seed=0, autoreset_mode=mode)
    torch.manual_seed(0)
    policy = Policy.from_env(env, network="mlp", hidden=16)
    ppo = PPO(env, policy, PPOConfig(num_steps=16, learning_rate=1e-2, gamma=0.9, gae_lambda=0.95, clip_vloss=False,
                                     update_epochs=4, num_minibatches=1, anneal_lr=False, seed=0))
    ppo.train(16 * 4 * 60)
    with torch.no_grad():
        _, value, _ = policy.forward_eval(torch.as_tensor(env.observations), ())
    assert abs(float(value.mean()) - 10.0) < 1.0, float(value.mean())
    env.close()


@pytest.mark.parametrize("mode", ["NEXT_STEP", "DISABLED"])
def test_as_sb3_refuses_modes_sb3_does_not_have(mode):
    """SB3's VecEnvs reset on the step an episode ends: another mode would hand SB3 wrong transitions."""
    pytest.importorskip("stable_baselines3")
    from packrl.compat.sb3 import as_sb3

    with vector.make(cartpole, 2, autoreset_mode=mode) as env:
        with pytest.raises(UsageError, match=f"as_sb3 needs autoreset_mode SAME_STEP .* got AutoresetMode.{mode}"):
            as_sb3(env)
    with vector.make(cartpole, 2) as env:
        as_sb3(env).reset()
