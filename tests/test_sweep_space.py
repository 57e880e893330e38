"""The search space of packrl sweep: the settings' default ranges, and every way a space file can be wrong."""
import math

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrl import config
from packrl.errors import ConfigError
from packrl.sweep.objective import Objective, parse_objective, report_points
from packrl.sweep.space import default_space, load_space, space_from


def test_every_default_range_is_declared_beside_its_setting_and_searchable():
    space = default_space()
    keys = {d.key for d in space.dimensions}
    assert {"train.learning_rate", "train.gamma", "train.num_steps", "train.num_minibatches"} <= keys
    by_key = {d.key: d for d in space.dimensions}
    assert by_key["train.learning_rate"].scale == "log"
    assert by_key["train.gamma"].scale == "log1m" and by_key["train.gamma"].param == "1-train.gamma"
    assert by_key["train.num_steps"].choices and by_key["train.num_minibatches"].choices
    for d in space.dimensions:  # each bound or choice is a value its setting accepts
        setting = config.settings()[d.key]
        assert setting.search is not None
        for value in d.choices or (d.low, d.high):
            setting.check(value)


def test_suggested_values_stay_inside_their_ranges_and_gamma_is_log_in_one_minus_gamma():
    space = space_from({"train": {"gamma": {"low": 0.9, "high": 0.999}}}, "s.toml")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    gammas = []
    for _ in range(200):
        values = space.suggest(study.ask())
        gamma = values["train"]["gamma"]
        assert 0.9 <= gamma <= 0.999
        gammas.append(gamma)
        for d in space.dimensions:
            section, _, name = d.key.partition(".")
            v = values[section][name]
            assert v in d.choices if d.choices else d.low - 1e-12 <= v <= d.high + 1e-12
    # log-uniform in 1 - gamma over [0.001, 0.1]: half the draws above 0.99 (uniform in gamma: 1 in 11)
    assert 0.4 < sum(g > 0.99 for g in gammas) / len(gammas) < 0.6


def test_a_space_file_narrows_widens_fixes_and_skips(tmp_path):
    path = tmp_path / "space.toml"
    path.write_text('skip = ["train.ent_coef"]\n[train]\nlearning_rate = { low = 1e-4, high = 1e-3 }\n'
                    'num_steps = { choices = [32, 64] }\nupdate_epochs = 4\n[policy]\nhidden = { choices = [32, 64] }\n'
                    '[vec]\nnum_envs = 16\n')
    space = load_space(path)
    dims = {d.key: d for d in space.dimensions}
    assert (dims["train.learning_rate"].low, dims["train.learning_rate"].high, dims["train.learning_rate"].scale) \
        == (1e-4, 1e-3, "log")  # the scale kept from the default range
    assert dims["train.num_steps"].choices == (32, 64)
    assert dims["policy.hidden"].choices == (32, 64)
    assert "train.ent_coef" not in dims and "train.update_epochs" not in dims
    assert space.fixed == {"train": {"update_epochs": 4}, "vec": {"num_envs": 16}}
    only = space_from({"defaults": False, "train": {"clip_coef": {"low": 0.1, "high": 0.3}}}, "s.toml")
    assert [d.key for d in only.dimensions] == ["train.clip_coef"]


@pytest.mark.parametrize("text, words", [
    ("[train]\nlerning_rate = { low = 1e-4, high = 1e-3 }", ["unknown setting train.lerning_rate", "train.learning_rate"]),
    ("[train]\nlearning_rate = { low = 1e-4, high = 1e-3, scale = \"logg\" }", ["unknown scale 'logg'"]),
    ("[train]\nclip_coef = { low = 0.3, high = 0.1 }", ["low 0.3 > high 0.1"]),
    ("[train]\nent_coef = { low = 0, high = 0.1, scale = \"log\" }", ["log range needs low > 0"]),
    ("[train]\nnum_steps = { choices = [] }", ["empty categorical"]),
    ("[train]\ngamma = { low = 0.9, high = 1.0, scale = \"log1m\" }", ["high < 1"]),
    ("[train]\nclip_coef = { low = 0.1, hihg = 0.3 }", ["unknown key 'hihg'"]),
    ("[train]\nnum_steps = { choices = [32, -1] }", ["train.num_steps"]),
    ("[trian]\nclip_coef = 0.2", ["unknown section or key 'trian'"]),
    ("[train]\nnorm_adv = { low = 0, high = 1 }", ["choices"]),
    ("[train]\nlearning_rate = { low = 1e-4", ["not valid TOML"]),
])
def test_a_bad_space_file_is_one_line_naming_the_file_and_the_setting(tmp_path, text, words):
    path = tmp_path / "bad.toml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as err:  # SpaceError, or the setting's own ConfigError for a bad value
        load_space(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    for word in words:
        assert word in message


@settings(max_examples=60, deadline=None)
@given(low=st.floats(-10, 10, allow_nan=False), high=st.floats(-10, 10, allow_nan=False),
       scale=st.sampled_from(["linear", "log", "log1m"]))
def test_any_float_range_is_either_searchable_inside_its_bounds_or_refused(low, high, scale):
    table = {"train": {"vf_coef": {"low": low, "high": high, "scale": scale}}}
    ok = 0 <= low <= high and (scale != "log" or low > 0) and (scale != "log1m" or high < 1)
    if not ok:
        with pytest.raises(ConfigError):
            space_from(table, "s.toml")
        return
    space = space_from(table, "s.toml")
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    value = space.suggest(trial)["train"]["vf_coef"]
    assert low - 1e-9 <= value <= high + 1e-9


def test_objectives_from_history_rows():
    rows = [{"global_step": 100 * i, "episode_return": float(r), "episodes": 10}
            for i, r in enumerate([1, 5, 9, 12, 8, 20, 30, 25, 40, 50], 1)]
    assert Objective("return", 1000).value(rows) == 50.0  # the last tenth of the steps: the last iteration
    # the mean of the last 20 episodes: (9 + 12) / 2 at step 400, (12 + 8) / 2 at 500, (8 + 20) / 2 at 600
    assert Objective("steps-to", 1000, 10.5).value(rows) == 400.0
    assert Objective("steps-to", 1000, 12).value(rows) == 600.0  # one iteration at 12 is not a mean of 20 at 12
    few = [{"global_step": 100, "episode_return": 500.0, "episodes": 1}, {"global_step": 200, "episode_return": 9.0,
           "episodes": 25}, {"global_step": 300, "episode_return": 500.0, "episodes": 15},
           {"global_step": 400, "episode_return": 500.0, "episodes": 15}]
    assert Objective("steps-to", 1000, 475).value(few) == 400.0  # not at 100 (one episode) nor 300 (5 of 9)
    assert Objective("steps-to", 1000, 99).value(rows) == 1000.0  # never reached: capped at the budget
    assert Objective("steps-to", 1000, 99).intermediate(rows) > Objective("steps-to", 1000, 45).intermediate(rows)
    assert Objective("return", 1000).value([{"global_step": 10}]) is None
    assert parse_objective("steps-to:475", 10).threshold == 475
    for bad in ("steps", "steps-to:", "steps-to:nan", "steps-to:abc"):
        with pytest.raises(ConfigError):
            parse_objective(bad, 10)
    points = report_points(1000)
    assert len(points) == 20 and points[-1] == 1000 and all(a < b for a, b in zip(points, points[1:]))
    assert math.isclose(Objective("return", 1000).intermediate(rows), (25 + 40 + 50) / 3)  # the last 3 iterations


@pytest.mark.parametrize("sampler", ["tpe", "cmaes", "random"])
def test_each_sampler_searches_the_default_space_and_the_same_seed_proposes_the_same_trials(sampler):
    from packrl.sweep.study import make_sampler

    def proposals(seed):
        study = optuna.create_study(sampler=make_sampler(sampler, seed), direction="maximize")
        out = []
        for i in range(12):  # past TPE's and CMA-ES's random start-up trials
            trial = study.ask()
            values = default_space().suggest(trial)
            out.append(values)
            study.tell(trial, values["train"]["learning_rate"] * (i % 3))
        return out

    assert proposals(0) == proposals(0)
    assert proposals(0) != proposals(1)


@pytest.mark.parametrize("name", ["median", "hyperband"])
def test_the_pruners_stop_a_trial_reporting_far_worse_than_the_others(name):
    from packrl.sweep.objective import REPORTS
    from packrl.sweep.study import make_pruner

    study = optuna.create_study(direction="maximize", pruner=make_pruner(name),
                                sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(12):  # Hyperband compares a trial with those of its own bracket (3 brackets here)
        trial = study.ask()
        for step in range(1, REPORTS + 1):
            trial.report(100.0 + step, step)
            trial.should_prune()  # as a trial process asks at each report (Hyperband records its rungs then)
        study.tell(trial, 100.0 + REPORTS)
    pruned_at = []
    for _ in range(3):
        weak = study.ask()
        for step in range(1, REPORTS + 1):
            weak.report(1.0, step)
            if weak.should_prune():
                pruned_at.append(step)
                break
    assert pruned_at and max(pruned_at) < REPORTS
    assert not make_pruner("none").prune(study, study.trials[-1])


def test_on_steps_to_the_median_pruner_stops_a_trial_behind_those_that_reached_early():
    """Trials that reached the threshold report their steps at every later point (packrl.sweep.trial); one still at
    the budget plus its distance at the second point is stopped there, not after a fifth of the budget."""
    from packrl.sweep.objective import REPORTS
    from packrl.sweep.study import make_pruner

    study = optuna.create_study(direction="minimize", pruner=make_pruner("median", "steps-to"))
    for _ in range(4):
        trial = study.ask()
        for step in range(1, REPORTS + 1):
            trial.report(1000.0 if step == 1 else 900.0, step)  # reached at 900 steps, before the second point
        study.tell(trial, 900.0)
    slow = study.ask()
    slow.report(100_000 + 300.0, 1)
    assert not slow.should_prune()  # the first point is the warm-up
    slow.report(100_000 + 250.0, 2)
    assert slow.should_prune()
    assert make_pruner("median", "return")._n_warmup_steps == REPORTS // 5
