"""``packrl inspect``: metadata, layouts and the tensor table of a checkpoint, read without torch."""
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from packrl.checkpoint import save_checkpoint
from packrl.emulation import Layout

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def checkpoint(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    opt = torch.optim.Adam(net.parameters())
    net(torch.randn(2, 4)).sum().backward()
    opt.step()
    layout = Layout.from_space(gym.spaces.Dict({"pos": gym.spaces.Box(0, 4, (2,), "int32"), "goal": gym.spaces.Discrete(5)}))
    return save_checkpoint(tmp_path / "ckpt", net.state_dict(), config={"policy": {"hidden": 8}},
                           layouts={"observation": layout}, env_id="CartPole-v1", seed=3, optimizer=opt.state_dict(),
                           global_step=4096, note="[bold]looks like markup[/bold] [nan nan]")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_the_packrl_command_inspects_without_importing_torch_or_numpy(checkpoint):
    out = _run("import sys\nfrom packrl.cli import main\nrc = main(['inspect', %r])\n"
               "print('RC', rc, 'torch' in sys.modules, 'numpy' in sys.modules, 'safetensors' in sys.modules)"
               % str(checkpoint))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "RC 0 False False False"
    text = out.stdout
    meta = json.loads((checkpoint / "metadata.json").read_text())
    for expected in ("0.weight", "F32", "[8, 4]", "128", "optimizer/0/exp_avg", "CartPole-v1", "4096",
                     meta["sha256"], "match", "['pos']", "<i4", "observation layout"):
        assert expected in text, expected
    assert "[bold]looks like markup[/bold] [nan nan]" in text  # values are escaped, not eaten as style tags


def test_the_module_main_and_json_output(checkpoint):
    out = _run("import sys\nfrom packrl.commands.inspect import main\nrc = main([%r, '--json'])\n"
               "assert 'torch' not in sys.modules\nsys.exit(rc)" % str(checkpoint))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["hashes_match"] and report["metadata"]["seed"] == 3
    assert report["tensors"]["0.weight"] == {"dtype": "F32", "shape": [8, 4], "bytes": 128}
    assert report["tensors"]["optimizer/1/exp_avg_sq"]["shape"] == [8]


def test_a_changed_checkpoint_is_shown_with_its_problem_and_exit_1(checkpoint, capsys):
    from packrl.cli import main

    meta = json.loads((checkpoint / "metadata.json").read_text())
    meta["env_id"] = "os:system"
    (checkpoint / "metadata.json").write_text(json.dumps(meta))
    assert main(["inspect", str(checkpoint)]) == 1
    out = capsys.readouterr().out
    assert "os:system" in out and "does not match the manifest" in out


def test_not_a_checkpoint_is_one_line_and_exit_2(tmp_path, capsys):
    from packrl.cli import main

    assert main(["inspect", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "metadata.json" in err
    (tmp_path / "metadata.json").write_text("[1, 2]")
    assert main(["inspect", str(tmp_path)]) == 2
    assert "expected a JSON object" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["a", "b"], ["--frobnicate", "x"]])
def test_bad_arguments_are_one_line_and_exit_2(argv, capsys):
    from packrl.cli import main

    with pytest.raises(SystemExit) as info:
        main(["inspect", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "packrl inspect: error" in err


def test_a_run_folder_stands_for_its_newest_checkpoint_still_without_torch(checkpoint):
    run = checkpoint.parent / "run"
    (run / "checkpoints").mkdir(parents=True)
    checkpoint.rename(run / "checkpoints" / "step-000000004096")
    out = _run("import sys\nfrom packrl.cli import main\nrc = main(['inspect', %r])\n"
               "print('RC', rc, 'torch' in sys.modules, 'numpy' in sys.modules)" % str(run))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "RC 0 False False"
    assert f"checkpoint: {run / 'checkpoints' / 'step-000000004096'}" in out.stdout
    assert "4096" in out.stdout and "match" in out.stdout
