"""threads=None on a large batch: ThreadChoice picks the serial loop or the threads from the step times it is
told. The logic is tested with made-up times (no timing thresholds); one end-to-end check that the default env
runs both kernels, gives the same results as threads=1, and reports its choice."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import packrl.envs as envs
from packrl.envs.thread_choice import SERIAL, ThreadChoice


def drive(choice: ThreadChoice, serial_s: float, threads_s: float, steps: int) -> list[int]:
    """Run ``steps`` steps where the serial loop takes ``serial_s`` and the threads ``threads_s``; the kernels run."""
    ran = []
    for _ in range(steps):
        k = choice.pick()
        ran.append(k)
        choice.record(k, serial_s if k == SERIAL else threads_s)
    return ran


def test_idle_machine_keeps_the_threads():
    choice = ThreadChoice(2)
    ran = drive(choice, serial_s=1.5, threads_s=1.0, steps=5000)
    assert choice.current == 2
    assert ran.count(SERIAL) / len(ran) < 0.02  # probes of the serial loop get rarer as it keeps losing
    assert choice.period == choice.max_period


def test_busy_core_moves_to_the_serial_loop_and_probes_rarely():
    choice = ThreadChoice(2)
    ran = drive(choice, serial_s=1.0, threads_s=20.0, steps=5000)
    assert choice.current == SERIAL
    threaded = ran.count(2)
    # each lost probe runs one threaded step (it lost by more than lost_early at once), and probes back off
    assert threaded <= 12
    cost = (ran.count(SERIAL) * 1.0 + threaded * 20.0) / len(ran)
    assert cost < 1.1  # within 10% of threads=1 over the run


def test_a_load_that_starts_mid_run_is_noticed_within_a_window():
    choice = ThreadChoice(2)
    drive(choice, serial_s=1.5, threads_s=1.0, steps=3000)
    assert choice.current == 2
    ran = drive(choice, serial_s=1.5, threads_s=20.0, steps=3000)
    assert choice.current == SERIAL
    assert ran[: choice.recent.maxlen + 4].count(SERIAL) >= 1  # switched within the slowdown window and a probe
    assert ran[100:].count(2) <= 12


def test_a_load_that_ends_is_noticed_by_a_later_probe():
    choice = ThreadChoice(2)
    drive(choice, serial_s=1.0, threads_s=20.0, steps=3000)
    assert choice.current == SERIAL
    ran = drive(choice, serial_s=1.5, threads_s=1.0, steps=2 * choice.max_period + 10)
    assert choice.current == 2
    assert ran[-choice.max_period:].count(2) > 0.9 * choice.max_period


def test_a_margin_keeps_near_ties_on_the_current_kernel():
    choice = ThreadChoice(2, margin=1.1)
    drive(choice, serial_s=1.05, threads_s=1.0, steps=2000)
    assert choice.current == 2 and choice.switches == 0
    choice = ThreadChoice(2, margin=1.1)
    drive(choice, serial_s=1.0, threads_s=1.05, steps=2000)
    assert choice.current == 2 and choice.switches == 0  # 5% slower is within the margin: no flapping


@settings(max_examples=60, deadline=None)
@given(serial=st.floats(0.1, 100.0), threads=st.floats(0.1, 100.0), seed=st.integers(0, 2**31 - 1))
def test_the_choice_settles_on_the_clearly_faster_kernel(serial, threads, seed):
    """Whatever the two kernels' times (with noise up to 5%), the choice ends on the one more than 20% faster."""
    rng = np.random.default_rng(seed)
    choice = ThreadChoice(2)
    for _ in range(3000):
        k = choice.pick()
        base = serial if k == SERIAL else threads
        choice.record(k, base * (1 + 0.05 * rng.random()))
    if serial < threads / 1.2:
        assert choice.current == SERIAL
    elif threads < serial / 1.2:
        assert choice.current == 2


def test_default_threads_on_a_large_batch_runs_both_kernels_with_the_same_results():
    n = 1024
    timed = envs.make("cartpole", num_envs=n, seed=3)
    serial = envs.make("cartpole", num_envs=n, seed=3, threads=1)
    assert timed.thread_choice is not None and serial.thread_choice is None
    assert "timed" in timed.compile_report
    timed.reset(), serial.reset()
    rng = np.random.default_rng(0)
    ran = set()
    for _ in range(300):
        ran.add(timed.thread_choice.pick())
        a = rng.integers(0, 2, n)
        o1, r1, t1, u1, _ = timed.step(a)
        o2, r2, t2, u2, _ = serial.step(a)
        np.testing.assert_array_equal(o1, o2)
        np.testing.assert_array_equal(t1, t2)
        np.testing.assert_array_equal(u1, u2)
    assert ran == {SERIAL, timed.threads}  # the choice tried both kernels
    assert envs.make("cartpole", num_envs=512).thread_choice is None  # small batches: the serial loop, untimed
