"""The replay buffer under each of gymnasium's autoreset modes. With SAME_STEP the step's final observation is
``infos["final_obs"]`` (packrl: ``final_observations``); with NEXT_STEP it is the step's own observation and
the next step of that env is the reset (its action ignored, reward 0), which must write nothing: pass
``masks=~ended_last_step``; with DISABLED it is the step's own observation and the caller resets. Fed by the
same policy, the three store the same slots, row by row, from SyncVectorEnv and from packrl's vector envs
(``vector.make(..., autoreset_mode=...)``, serial and multiprocessing)."""
import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from packrl import vector
from packrl.train.replay import ReplayBuffer

ROWS, GAMMA = 3, 0.9


def make_env():
    return gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, max_episode_steps=12)


def policy(obs):
    """Deterministic, so every mode sees the same episodes: row 0 balances (truncated at 12 steps), the others
    push right until the pole falls (terminated)."""
    balance = (obs[:, 2] + obs[:, 3] > 0).astype(np.int64)
    return np.where(np.arange(len(obs)) == 0, balance, 1)


def fill(mode, steps):
    env = SyncVectorEnv([make_env] * ROWS, autoreset_mode=mode)
    buf = ReplayBuffer(512, ROWS, (4,), np.float32, gamma=GAMMA, seed=0)
    obs, _ = env.reset(seed=11)
    ended = np.zeros(ROWS, bool)
    for _ in range(steps):
        actions = policy(obs)
        next_obs, rewards, terms, truncs, infos = env.step(actions)
        if mode == AutoresetMode.SAME_STEP:
            finals = np.where(infos.get("_final_obs", np.zeros(ROWS, bool))[:, None],
                              np.stack([o if o is not None else np.zeros(4, np.float32)
                                        for o in infos.get("final_obs", [None] * ROWS)]), next_obs)
            buf.add(obs, actions, rewards, terms, truncs, finals.astype(np.float32))
        elif mode == AutoresetMode.NEXT_STEP:
            buf.add(obs, actions, rewards, terms, truncs, next_obs, masks=~ended)  # the reset step writes nothing
            ended = terms | truncs
        else:
            buf.add(obs, actions, rewards, terms, truncs, next_obs)
            ended = terms | truncs
            if ended.any():
                next_obs, _ = env.reset(options={"reset_mask": ended})
        obs = next_obs
    env.close()
    return buf


def slots(buf, row):
    """The row's held slots, oldest first: (observation, reward, discount, last)."""
    order = (np.arange(buf.count[row]) + buf.ptr[row] - buf.count[row]) % buf.capacity
    return [(tuple(buf.observations[s, row]), float(buf.rewards[s, row]), float(buf.discounts[s, row]),
             bool(buf.last[s, row])) for s in order]


def test_every_autoreset_mode_stores_the_same_slots():
    same = fill(AutoresetMode.SAME_STEP, 40)
    kinds = {slots(same, r)[i][2] for r in range(ROWS) for i in range(int(same.count[r]) - 1) if slots(same, r)[i + 1][3]}
    assert kinds == {0.0, np.float32(GAMMA)}, "the stream must hold terminations and truncations"
    ends = int(same.last.sum())
    for mode in (AutoresetMode.NEXT_STEP, AutoresetMode.DISABLED):
        other = fill(mode, 40 + ends)  # NEXT_STEP spends one step per reset; enough steps to cover SAME_STEP's
        for row in range(ROWS):
            mine, theirs = slots(same, row), slots(other, row)
            assert theirs[:len(mine)] == mine, (mode, row)


def test_next_step_without_the_mask_would_store_a_false_transition():
    """The check above can fail: without ``masks``, NEXT_STEP's reset step writes the reset observation as a
    step whose predecessor is the final observation's slot, an extra slot that SAME_STEP never stores."""
    env = SyncVectorEnv([make_env] * ROWS, autoreset_mode=AutoresetMode.NEXT_STEP)
    buf = ReplayBuffer(512, ROWS, (4,), np.float32, gamma=GAMMA, seed=0)
    obs, _ = env.reset(seed=11)
    for _ in range(40):
        actions = policy(obs)
        next_obs, rewards, terms, truncs, _ = env.step(actions)
        buf.add(obs, actions, rewards, terms, truncs, next_obs)
        obs = next_obs
    same = fill(AutoresetMode.SAME_STEP, 40)
    assert any(slots(buf, row)[:len(slots(same, row))] != slots(same, row) for row in range(ROWS))


def fill_packrl(mode, steps, backend):
    """``fill`` fed by packrl's vector env in ``mode``: SAME_STEP's ``final_observations``; NEXT_STEP's
    ``ended_envs`` read before the step (the envs that reset at it, whose action is ignored) as the mask;
    DISABLED's ended envs reset with a reset mask. packrl's arrays are views, so observations are copied."""
    kw = {"num_workers": 1, "context": "fork"} if backend == "multiprocessing" else {}
    env = vector.make(make_env, ROWS, backend=backend, autoreset_mode=mode, **kw)
    assert env.metadata["autoreset_mode"] == mode
    buf = ReplayBuffer(512, ROWS, (4,), np.float32, gamma=GAMMA, seed=0)
    obs, _ = env.reset(seed=11)
    obs = obs.copy()
    for _ in range(steps):
        actions = policy(obs)
        resetting = env.ended_envs
        next_obs, rewards, terms, truncs, _ = env.step(actions)
        if mode == AutoresetMode.SAME_STEP:
            buf.add(obs, actions, rewards, terms, truncs, env.final_observations)
        elif mode == AutoresetMode.NEXT_STEP:
            buf.add(obs, actions, rewards, terms, truncs, next_obs, masks=~resetting)
        else:
            buf.add(obs, actions, rewards, terms, truncs, next_obs)
            if env.ended_envs.any():
                next_obs, _ = env.reset(options={"reset_mask": env.ended_envs})
        obs = next_obs.copy()
    env.close()
    return buf


@pytest.mark.parametrize("backend", ["serial", "multiprocessing"])
@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.name)
def test_packrl_vector_envs_store_what_sync_vector_env_stores_in_every_mode(backend, mode):
    """End to end: packrl's vector env in each autoreset mode fills the buffer slot for slot as SyncVectorEnv's
    SAME_STEP does (the reference above)."""
    same = fill(AutoresetMode.SAME_STEP, 40)
    ends = int(same.last.sum())
    assert ends >= 4
    mine = fill_packrl(mode, 40 if mode != AutoresetMode.NEXT_STEP else 40 + ends, backend)
    for row in range(ROWS):
        theirs = slots(same, row)
        assert slots(mine, row)[:len(theirs)] == theirs, (mode, row)
