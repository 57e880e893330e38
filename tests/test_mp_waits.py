"""How the multiprocessing backend's waits end (at once, by spinning, blocked), counted per process:
the numbers benchmarks/mp_waits.py reads to tell spin from blocking wake-ups (issue 19)."""
import multiprocessing
import threading
import time

import gymnasium
import numpy as np

from packrl import vector
from packrl.vector.multiprocessing import WAIT_KINDS, Spinner


def test_spinner_counts_each_way_a_wait_ends():
    sem = multiprocessing.get_context("fork").Semaphore(0)
    spinner = Spinner(0.5)
    sem.release()
    assert spinner.wait(sem)  # posted already
    later = threading.Timer(0.01, sem.release)
    later.start()
    assert spinner.wait(sem)  # posted while spinning
    later.join()
    assert not Spinner(0.0, spinner.counts).wait(sem)  # nothing posted, no spin: it blocks
    assert dict(zip(WAIT_KINDS, spinner.counts.tolist())) == {"at once": 1, "spun": 1, "blocked": 1}
    quick = Spinner(1e-6)
    assert not quick.wait(sem) and not quick.wait(sem)  # a failed spin, then a skipped one: both block
    assert quick.counts.tolist() == [0, 0, 2]


def test_wait_counts_of_main_and_workers_add_up_to_the_waits():
    def make():
        return gymnasium.make("CartPole-v1")

    env = vector.make(make, 4, backend="multiprocessing", num_workers=1, main_spin_s=0.0, worker_spin_s=0.0)
    try:
        env.reset(seed=0)
        before = env.wait_counts()
        for _ in range(30):
            env.step(np.zeros(4, np.int64))
        time.sleep(0.05)  # the worker's wait for the next command has begun (and blocked: nothing comes)
        after = env.wait_counts()
    finally:
        env.close()
    assert set(after) == {"main", "worker 0"}
    main = {k: after["main"][k] - before["main"][k] for k in WAIT_KINDS}
    worker = {k: after["worker 0"][k] - before["worker 0"][k] for k in WAIT_KINDS}
    assert sum(main.values()) == 30 and main["spun"] == 0  # one wait per step for the worker's rows; no spin window
    assert sum(worker.values()) in (30, 31) and worker["spun"] == 0  # one wait per command (and the next one)
