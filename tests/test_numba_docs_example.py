"""docs/numba_envs.md's multi-agent example runs as written, fits in 60 lines, and its agents end and reset."""
import re
import runpy
from pathlib import Path

import numpy as np

DOC = Path(__file__).resolve().parent.parent / "docs" / "numba_envs.md"


def test_the_multi_agent_example_runs_and_is_short(tmp_path):
    text = DOC.read_text()
    section = text[text.index("## Multi-agent Numba envs"):]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1
    code = blocks[0]
    assert len(code.splitlines()) <= 60
    example = tmp_path / "race_example.py"  # a file, as a user's module would be (Numba's cache=True needs one)
    example.write_text(code)
    env = runpy.run_path(str(example), run_name="race_example")["env"]
    assert env.num_agents == 128 and env.agents_per_env == 2 and list(env.possible_agents) == ["left", "right"]
    reached = 0
    for _ in range(40):
        obs = env.observations.reshape(64, 2, 2)
        toward = np.sign(obs[:, :, 1] - obs[:, :, 0]).astype(np.int64) + 1  # walk to the goal
        _, rewards, terminals, _, _ = env.step(toward.reshape(-1))
        reached += int(terminals.sum())
    assert reached >= 64  # agents reached the goal, ended, and their copies reset
