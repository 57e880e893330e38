"""Issue 21's Targets tables of benchmarks/learning.py and benchmarks/train.py: the met / not met decision and the gap
arithmetic (benchmarks/targets.py) on numbers on either side of each target, the rows each benchmark builds from its
results, and the splits that real short runs hand to them. No timing is asserted: every figure here is crafted or
only checked for how its parts add up."""
import pytest
import torch

from tests.benchmark_modules import load_benchmark


@pytest.fixture(scope="module")
def targets():
    return load_benchmark("targets")


@pytest.fixture(scope="module")
def learning():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_benchmark("learning")
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def train():
    return load_benchmark("train")


# a Numba CartPole run like the third round's: 7.97 s to 475 at 34,816 steps, 136 iterations of 20 minibatches
def _numba_run(targets, total=7.97):
    return targets.Split(total, 34_816, 136, rollout=1.80, update=5.60, minibatches=2_720)


def test_wall_target_flips_at_its_limit_and_splits_the_seconds(targets):
    run = _numba_run(targets)
    assert targets.wall_target("w", 8.0, run).met
    assert targets.wall_target("w", 7.97, run).met
    missed = targets.wall_target("w", 3.0, run)
    assert not missed.met and missed.measured == "7.97 s"
    split, updates, per_step = missed.gap
    assert "rollouts 1.80 s + updates 5.60 s (2,720 minibatches, 2.06 ms each) + other 0.57 s" in split
    # 3.00 - 1.80 - 0.57 = 0.63 s of updates: 0.232 ms per minibatch, 8.9x cheaper than 2.06 ms
    assert "updates <= 0.63 s: 0.232 ms per minibatch (8.89x cheaper)" in updates
    # 7.97 s / 34,816 steps = 229 us a step; 3 s of it is 13,105 steps, 2.7x fewer
    assert "229 us per agent step" in per_step and "within 13,105 steps (2.66x fewer" in per_step


def test_wall_target_says_when_free_updates_would_not_do(targets):
    gap = targets.wall_target("w", 2.0, _numba_run(targets)).gap
    assert "rollouts + other alone take 2.37 s: free updates would still miss 2.00 s by 0.37 s" in gap[1]


def test_wall_ratio_target_takes_its_limit_from_the_anchor(targets):
    run = targets.Split(7.50, 34_816, 136, rollout=2.5, update=4.5, minibatches=2_720)
    missed = targets.wall_ratio_target("g", 0.5, "SB3 zoo", 12.48, 25_600, run)
    assert not missed.met and missed.measured == "7.50 s (0.60x SB3 zoo's 12.48 s)"
    assert missed.gap[0] == "SB3 zoo: 12.48 s to threshold at 25,600 steps; 0.5x is 6.24 s"
    assert "updates <= 3.24 s" in missed.gap[2]  # 6.24 - 2.5 - 0.5
    met = targets.wall_ratio_target("g", 0.5, "SB3 zoo", 16.0, 25_600, run)
    assert met.met and met.gap == () and met.goal == "<= 0.5x SB3 zoo"


def _rate_pair(targets, ours_total: float):
    anchor = targets.Split(4.0, 32_768, 32, rollout=2.2, update=1.7, minibatches=512)
    return anchor, targets.Split(ours_total, 32_768, 32, rollout=0.8, update=1.1, minibatches=512)


def test_rate_target_flips_at_the_ratio_and_bounds_it(targets):
    anchor, ours = _rate_pair(targets, 2.0)
    assert targets.rate_target("r", 2.0, "cleanrl-style", anchor, ours).met  # 16,384 / 8,192 steps/s
    anchor, ours = _rate_pair(targets, 2.2)
    missed = targets.rate_target("r", 2.0, "cleanrl-style", anchor, ours, [("floor", 20e-6), ("slow floor", 70e-6)])
    assert not missed.met and missed.measured.startswith("1.82x (14,895 / 8,192 steps/s)")
    split, need, floor, slow = missed.gap
    # per 1,024-step iteration: anchor 125 ms; packrl 68.75 = 25 + 34.38 (2.15 ms per minibatch) + 9.38
    assert split == ("per 1,024-step iteration: cleanrl-style 125.0 ms = rollout 68.8 + update 53.1 (3.32 ms per minibatch) + other 3.1; "
                     "packrl 68.8 ms = rollout 25.0 + update 34.4 (2.15 ms per minibatch) + other 9.4")
    # 2x needs 62.5 ms; free rollout: 125 / 43.75 = 2.86x; free update: 125 / 34.38 = 3.64x
    assert "<= 62.5 ms per iteration (6.2 ms less)" in need
    assert "rollout free at most 2.86x" in need and "update free at most 3.64x" in need
    # a floor of 20 us a step is 20.5 ms an iteration: at most 6.10x, 62.5 - 20.5 = 42.0 ms left for packrl
    assert "floor: 20.5 ms per iteration; with everything else of packrl free at most 6.10x" in floor
    assert "packrl beyond it 48.3 ms, 2x needs <= 42.0 ms" in floor
    assert "71.7 ms per iteration" in slow and slow.endswith("so 2x is out of reach")


def test_rate_target_compares_iterations_of_the_anchor_size(targets):
    anchor = targets.Split(4.0, 32_768, 32, rollout=2.2, update=1.7, minibatches=512)
    ours = targets.Split(2.2, 32_768, 64, rollout=0.8, update=1.1, minibatches=1024)  # half-size iterations
    split = targets.rate_target("r", 2.0, "cleanrl-style", anchor, ours).gap[0]
    assert "packrl 68.8 ms = rollout 25.0 + update 34.4 (2.15 ms per minibatch)" in split


def test_median_index_is_a_run(targets):
    assert targets.median_index([3.0, 1.0, 2.0]) == 2
    assert targets.median_index([4.0, 1.0, 3.0, 2.0]) == 3  # the lower middle: 2.0
    assert targets.median_index([5.0]) == 0


def _result(learning, steps, seconds=None, eval_mean=500.0, split=None):
    return learning.Result(steps, seconds, 500.0 if steps else 210.0, eval_mean, 100_096, split)


def test_seeds_target_names_each_seed_that_missed(learning, targets):
    ok = {0: _result(learning, 30_000), 1: _result(learning, 40_000)}
    assert targets.seeds_target("s", 475.0, 100_000, ok, eval_too=True).met
    outcomes = {**ok, 2: _result(learning, None), 3: _result(learning, 120_000), 4: _result(learning, 50_000, eval_mean=400.0)}
    missed = targets.seeds_target("s", 475.0, 100_000, outcomes, eval_too=True)
    assert not missed.met and missed.measured == "2/5 seeds"
    assert missed.gap == ("seed 2: not within its 100,096 steps; final moving mean 210.000, final eval 500.000",
                          "seed 3: only at 120,000 steps; final moving mean 500.000, final eval 500.000",
                          "seed 4: met at 50,000 steps, but the final greedy eval is 400.000 < 475")
    assert targets.seeds_target("s", 475.0, 100_000, {4: outcomes[4]}, eval_too=False).met


def test_learning_targets_cover_the_tasks_that_ran(learning, targets):
    def seeds(totals):
        return {seed: _result(learning, 30_000, t, split=targets.Split(t, 30_000, 118, 1.0, t - 1.5, 2_360))
                for seed, t in enumerate(totals)}

    sb3 = {seed: _result(learning, 25_600, t) for seed, t in enumerate((12.0, 13.0, 20.0))}
    runs = {"cartpole-gym": seeds((7.0, 6.0, 8.0)), "cartpole-numba": seeds((2.5, 2.9, 9.0)), "sb3-cartpole": sb3}
    rows = {t.name: t for t in learning.learning_targets(runs)}
    assert list(rows) == ["CartPole-v1 (gymnasium), defaults: solved", "cartpole (Numba), defaults: solved",
                          "cartpole (Numba): wall to 475", "CartPole-v1 (gymnasium): wall to 475"]
    assert rows["cartpole (Numba): wall to 475"].met  # the median run: 2.9 s
    gym = rows["CartPole-v1 (gymnasium): wall to 475"]
    assert not gym.met and gym.measured == "7.00 s (0.54x SB3 zoo's 13.00 s)"  # 0.5x of 13.0 s is 6.5 s
    runs["sb3-cartpole"] = {seed: _result(learning, 25_600, t) for seed, t in enumerate((14.0, 15.0, 20.0))}
    assert {t.name: t for t in learning.learning_targets(runs)}["CartPole-v1 (gymnasium): wall to 475"].met
    assert [t.name for t in learning.learning_targets({"tictactoe": seeds((1.0,))})] == ["tictactoe vs random (win+draw)"]
    unsolved = learning.learning_targets({"cartpole-numba": {0: _result(learning, None)}})
    assert [t.met for t in unsolved] == [False, False] and unsolved[1].measured == "no seed met 475"


def test_throughput_targets_check_each_packrl_row_against_its_group(train, targets):
    def runs(*totals):
        return [targets.Split(t, 32_768, 32, 0.4 * t, 0.5 * t, 512) for t in totals]

    results = {"8 envs": {"cleanrl-style (gymnasium)": runs(4.0, 3.0, 5.0), "sb3 PPO (gymnasium)": runs(4.0),
                          "packrl gymnasium, default policy": runs(2.1, 1.9, 2.0),
                          "packrl numba, default policy": runs(1.2, 1.0, 1.1)}}
    floors = {"8 envs": {"gymnasium": [20e-6], "sync": [30e-6], "numba": [1e-6]}}
    rows = train.throughput_targets(results, floors)
    assert [t.name for t in rows] == ["packrl gymnasium, default policy, 8 envs", "packrl numba, default policy, 8 envs"]
    gym, numba = rows
    assert gym.met and gym.measured.startswith("2.00x")  # median runs: 4.0 s against 2.0 s
    assert not numba.met and numba.measured.startswith("3.64x")  # 4.0 / 1.1, against 4x
    assert [line.split(" (")[0] for line in numba.gap[2:]] == ["Numba CartPole stepping"]


def test_real_short_runs_hand_over_splits_that_add_up(train, learning):
    torch.set_num_threads(1)
    cleanrl = train.cleanrl_rate(2048)
    assert (cleanrl.steps, cleanrl.iterations, cleanrl.minibatches) == (2048, 2, 32)
    assert 0 < cleanrl.rollout and 0 < cleanrl.update and cleanrl.rollout + cleanrl.update <= cleanrl.total
    packrl = train.packrl_ppo(2048, "numba", network="default")
    assert (packrl.steps, packrl.iterations, packrl.minibatches) == (2048, 2, 32)
    assert 0 < packrl.rollout and 0 < packrl.update and packrl.rollout + packrl.update <= packrl.total
    assert all(train.env_only_seconds(256, backend) > 0 for backend in ("gymnasium", "sync", "numba"))
    # a threshold any policy meets: the split is taken at the first iteration whose last 20 episodes average it
    result = learning.packrl_run("cartpole", 0, 5.0, 1024, 20, {})
    split = result.split
    assert result.steps == split.steps and result.seconds == split.total
    assert split.minibatches == 20 * split.iterations and split.steps == 256 * split.iterations
    assert 0 < split.rollout + split.update <= split.total
