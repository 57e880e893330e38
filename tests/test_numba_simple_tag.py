"""The Numba simple_tag (agents in two groups: 3 adversaries observing 16 floats, 1 good agent observing 14) against
mpe2's own simple_tag_v3, transition by transition: mpe2's state copied into one copy, both stepped with the same
actions, observations, rewards and flags compared each step (float32 tolerance); its rows, groups and masks
against vector.make of the mpe2 ParallelEnv; its PettingZoo face against PettingZoo's own API test."""
import numpy as np
import pytest
from mpe2 import simple_tag_v3
from pettingzoo.test import parallel_api_test

import packrl.envs as envs
from packrl import vector
from packrl.envs import pettingzoo_face, simple_tag
from packrl.errors import EnvError


def copy_state_in(env, world) -> None:
    for a, agent in enumerate(world.agents):
        env.state["pos"][0, a] = agent.state.p_pos
        env.state["vel"][0, a] = agent.state.p_vel
    for m, mark in enumerate(world.landmarks):
        env.state["obstacles"][0, m] = mark.state.p_pos


def agent_obs(env, rows: np.ndarray, row: int) -> np.ndarray:
    layout = env.emulated.groups[env.emulated.row_group[row]].observation
    return layout.to_native(layout.unpack(rows[row, : layout.nbytes]))


def run_against_mpe2(seed: int, crowd: bool) -> tuple[int, int, int]:
    """One mpe2 episode with random actions; returns the steps where an adversary touched the good agent, where the
    good agent was out of bounds, and where an agent touched an obstacle (before the step)."""
    ref = simple_tag_v3.parallel_env()
    ref_obs, _ = ref.reset(seed=seed)
    world = ref.unwrapped.world
    if crowd:  # the agents bunched at an obstacle's edge: agent and obstacle contact forces, catches at once
        edge = world.landmarks[0].state.p_pos + np.array([0.25, 0.0])
        near = edge + np.random.default_rng(seed).uniform(-0.05, 0.05, (4, 2))
        for agent, where in zip(world.agents, near):
            agent.state.p_pos = where.copy()
        ref_obs = {a: ref.unwrapped.observe(a) for a in ref.agents}
    ours = envs.make("simple_tag", num_envs=1, seed=seed)
    ours.reset()
    copy_state_in(ours, world)
    rng = np.random.default_rng(seed)
    catches = outside = contacts = 0
    for t in range(simple_tag.MAX_CYCLES):
        contacts += any(np.linalg.norm(agent.state.p_pos - mark.state.p_pos) < agent.size + mark.size
                        for agent in world.agents for mark in world.landmarks)
        actions = rng.integers(0, 5, 4)
        ref_obs, ref_rew, ref_term, ref_trunc, _ = ref.step({a: int(actions[k]) for k, a in enumerate(ref.possible_agents)})
        _, rew, term, trunc, _ = ours.step(actions)
        ended = trunc.any() or term.any()
        rows = ours.final_observations if ended else ours.observations
        for k, agent in enumerate(ref.possible_agents):
            got = agent_obs(ours, rows, k)
            assert got.shape == ref_obs[agent].shape, agent
            np.testing.assert_allclose(got, ref_obs[agent], rtol=1e-5, atol=1e-5, err_msg=f"step {t} {agent}")
            assert rew[k] == pytest.approx(ref_rew[agent], rel=1e-5, abs=1e-5), (t, agent)
            assert (term[k], trunc[k]) == (ref_term[agent], ref_trunc[agent]), (t, agent)
        catches += ref_rew["adversary_0"] > 0
        outside += np.abs(world.agents[3].state.p_pos).max() > 0.9
    assert ended and not ref.agents  # both ended the episode at max_cycles
    assert ours.masks.all()  # and ours reset in the same step
    return catches, outside, contacts


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_transitions_match_mpe2(seed):
    run_against_mpe2(seed, crowd=False)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_transitions_match_mpe2_with_catches_and_obstacles(seed):
    catches, _, contacts = run_against_mpe2(seed, crowd=True)
    assert catches > 0 and contacts > 0  # the +10 / -10 rewards and the obstacles' contact forces were compared


def test_the_bounds_penalty_is_compared():
    assert sum(run_against_mpe2(seed, crowd=False)[1] for seed in range(6, 16)) > 0


def test_rows_groups_and_masks_are_those_of_the_emulated_pettingzoo_env():
    n = 4
    ref = vector.make(lambda: simple_tag_v3.parallel_env(), n, backend="serial", seed=0)
    ours = vector.make("simple_tag", n, backend="numba", seed=0)
    for attr in ("num_envs", "num_agents", "agents_per_env", "possible_agents", "single_observation_space",
                 "single_action_space"):
        assert getattr(ours, attr) == getattr(ref, attr), attr
    assert len(ours.emulated.groups) == len(ref.emulated.groups) == 2
    for mine, theirs in zip(ours.emulated.groups, ref.emulated.groups):
        assert (mine.agents, mine.rows) == (theirs.agents, theirs.rows)
        assert mine.observation == theirs.observation and mine.action == theirs.action
    assert ours.emulated.nbytes == ref.emulated.nbytes == 64
    o1, _ = ref.reset(seed=0)
    o2, _ = ours.reset(seed=0)
    assert (o1.shape, o1.dtype) == (o2.shape, o2.dtype)
    np.testing.assert_array_equal(o2[3::4, 56:], 0)  # the good agent's 14 floats leave the row's last 8 bytes zero
    for t in range(simple_tag.MAX_CYCLES):
        a = np.random.default_rng(t).integers(0, 5, n * 4)
        r1, r2 = ref.step(a), ours.step(a)
        for k in (2, 3):  # terminals, truncations per row
            np.testing.assert_array_equal(r1[k], r2[k])
        np.testing.assert_array_equal(ref.masks, ours.masks)
    assert ours.truncations.all() and ref.truncations.all()


def test_a_nan_observation_names_the_agent_of_its_group():
    env = envs.make("simple_tag", num_envs=2, seed=0)
    env.reset()
    env.state["vel"][1, 3, 0] = np.nan  # the good agent of copy 1: its own velocity leads its observation
    with pytest.raises(EnvError, match=r"env index 1, agent 'agent_0'.*NaN.*Other copies' rows are intact"):
        env.step(np.zeros(8, np.int64))


def test_threaded_steps_give_the_serial_results():
    serial = envs.make("simple_tag", num_envs=300, seed=1, threads=1)
    threaded = envs.make("simple_tag", num_envs=300, seed=1, threads=2)
    np.testing.assert_array_equal(serial.reset()[0], threaded.reset()[0])
    rng = np.random.default_rng(0)
    for _ in range(60):  # past the 25-step truncation: same-step resets
        acts = rng.integers(0, 5, 1200)
        for a, b in zip(serial.step(acts), threaded.step(acts)):
            if isinstance(a, np.ndarray):
                np.testing.assert_array_equal(a, b)


def test_its_pettingzoo_face_passes_the_parallel_api_test():
    env = pettingzoo_face.parallel_env("simple_tag")
    assert env.observation_space("adversary_0").shape == (16,) and env.observation_space("agent_0").shape == (14,)
    parallel_api_test(env, num_cycles=60)
    obs, _ = env.reset(seed=3)
    assert obs["adversary_1"].shape == (16,) and obs["agent_0"].shape == (14,)


def test_agents_of_one_group_must_be_adjacent():
    spec = simple_tag.spec()
    import dataclasses

    mixed = ("adversary_0", "agent_0", "adversary_1", "adversary_2")
    with pytest.raises(EnvError, match="not adjacent"):
        envs.batched(dataclasses.replace(spec, agents=mixed), 1)


@pytest.mark.parametrize("env_id", ["simple_tag", "mpe2.simple_tag_v3"])
def test_packrl_train_trains_one_policy_per_group_and_eval_reads_it(env_id, tmp_path):
    """packrl train on the Numba port and on mpe2's own env: a GroupedPolicy (the simple-spread preset), a checkpoint
    that packrl eval plays and --resume continues."""
    import json
    import subprocess
    import sys

    def packrl(*args):
        # quiet: this file's tests take at most 9 s
        return subprocess.run([sys.executable, "-m", "packrl", *args], capture_output=True, text=True, timeout=600)

    run = tmp_path / "run"
    done = packrl("train", env_id, "--total-steps", "4096", "--no-live", "--out", str(run))
    assert done.returncode == 0, done.stderr
    assert "simple-spread" in done.stdout + done.stderr
    weights = json.loads((run / "checkpoint" / "metadata.json").read_text())
    assert weights["config"]["policy"]["critic"] == "separate"
    evaluated = packrl("eval", str(run / "checkpoint"), "--episodes", "4")
    assert evaluated.returncode == 0 and "mean return" in evaluated.stdout, evaluated.stderr
    resumed = packrl("train", "--resume", str(run / "checkpoint"), "--total-steps", "8192", "--no-live")
    assert resumed.returncode == 0, resumed.stderr
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert rows[-1]["global_step"] >= 8192 and any(k.startswith("episode_return/agent_0") for k in rows[-1])


@pytest.mark.parametrize("args, words", [
    (["mpe2.simple_world_comm_v3"], "needs one action space for every group"),
    (["simple_tag", "--network", "lstm"], "must be stateless"),
    (["simple_tag", "--train.overlap", "true"], "train.overlap"),
])
def test_what_one_policy_per_group_cannot_do_is_refused_in_one_line(args, words, tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "packrl", "train", *args, "--total-steps", "1000", "--no-live",
                           # quiet: the whole test takes 2 s
                           "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines
    assert not (tmp_path / "run" / "checkpoint").exists()


@pytest.mark.slow
def test_defaults_learn_each_group_against_random_play(one_torch_thread):
    """`packrl train simple_tag` (one policy per group, the simple-spread preset) for 1M agent steps on seeds 0-2;
    each group greedy against a random other group on mpe2's own simple_tag_v3, 96 episodes
    (benchmarks/tag_learning.py). Random play: predators 4.9, prey -13.6. Measured, seeds 0-4: predators 9.6-22.4,
    prey -3.3 to -9.3 (about 65 s of training a seed on one core). Thresholds with a margin on the mean and a floor
    for each seed."""
    from tests.benchmark_modules import load_benchmark

    tag = load_benchmark("tag_learning")
    random = [tag.against_random(None, g) for g in (0, 1)]
    assert random[0] < 6.0 and random[1] < -12.0, random  # the baseline the thresholds stand on
    predators, prey = [], []
    for seed in range(3):
        policy, preset = tag.train(seed, 1_000_000)
        assert preset == "simple-spread"
        predators.append(tag.against_random(policy, 0))
        prey.append(tag.against_random(policy, 1))
    assert min(predators) >= 7.0 and np.mean(predators) >= 9.0, (predators, random)
    assert min(prey) >= -11.0 and np.mean(prey) >= -9.0, (prey, random)


def test_every_groups_layout_is_recorded_and_checked(tmp_path):
    """A simple_tag checkpoint records the prey's layout beside the predators' (``layouts.observation/1``); eval
    refuses, in one line, a re-signed checkpoint whose prey layout differs or that records one group only."""
    import json
    import subprocess
    import sys

    from packrl.checkpoint import manifest_sha256

    def packrl(*args):
        # quiet: this file's tests take at most 9 s
        return subprocess.run([sys.executable, "-m", "packrl", *args], capture_output=True, text=True, timeout=600)

    run = tmp_path / "run"
    assert packrl("train", "simple_tag", "--total-steps", "2048", "--no-live", "--out", str(run)).returncode == 0
    meta = json.loads((run / "checkpoint" / "metadata.json").read_text())
    assert meta["layouts"]["observation/1"] != meta["layouts"]["observation"]
    assert packrl("eval", str(run / "checkpoint"), "--episodes", "2").returncode == 0

    def resigned(change):
        edited = json.loads(json.dumps(meta))
        change(edited["layouts"])
        edited["sha256"] = manifest_sha256(edited)
        (run / "checkpoint" / "metadata.json").write_text(json.dumps(edited))
        done = packrl("eval", str(run / "checkpoint"), "--episodes", "2")
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        return lines[0]

    def narrower_prey(layouts):
        layouts["observation/1"]["leaves"][0]["shape"] = [13]

    assert "layouts.observation/1 differs" in resigned(narrower_prey)
    assert "1 agent group(s)" in resigned(lambda layouts: layouts.pop("observation/1"))
