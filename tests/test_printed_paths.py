"""A run folder named with control characters and markup (``--out``) is printed escaped in the closing
``run folder:``, ``checkpoint:`` and ``learning curve:`` lines: nothing reaches the terminal raw, no markup
is eaten."""
import contextlib
import io
import os
import subprocess

import pytest

from packrl.cli import main


def test_closing_lines_escape_the_out_folder(tmp_path):
    out = tmp_path / "run\x1b]0;pwned\x07[bold]x[/bold]\u202e"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["train", "CartPole-v1", "--num-envs", "2", "--total-steps", "64", "--train.num_steps", "32",
                     "--hidden", "8", "--no-live", "--out", str(out)])
    text = stdout.getvalue() + stderr.getvalue()
    assert code == 0, text[-2000:]
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text, repr(text[-1000:])
    shown = "run\\x1b]0;pwned\\x07[bold]x[/bold]\\u202e"
    lines = {line.split(":")[0]: line for line in stdout.getvalue().splitlines()
             if line.startswith(("run folder:", "checkpoint:", "learning curve:"))}
    assert set(lines) == {"run folder", "checkpoint", "learning curve"}, stdout.getvalue()[-2000:]
    for line in lines.values():
        assert shown in line, line
    assert (out / "history.jsonl").is_file()


MARKED = "run\x1b[31m[/red]x[bold]\u202e"  # a control sequence, a closing tag with no opening one, an opening tag
MARKED_SHOWN = "run\\x1b[31m[/red]x[bold]\\u202e"


def _train(argv: list[str]) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["train", *argv, "--num-envs", "1", "--train.num_steps", "16", "--hidden", "8", "--no-live"])
    return code, stdout.getvalue(), stderr.getvalue()


@pytest.mark.parametrize("stop", ["error", "sigterm", "second ctrl-c"])
def test_stop_lines_escape_the_out_folder_and_name_the_env_to_resume_with(tmp_path, stop):
    """The lines of a stop (an error, a signal, a second Ctrl-C) name the run folder and checkpoint shown escaped,
    markup included: an --out holding '[/red]' gave rich's MarkupError traceback (exit 1) in place of the stop's
    exit code. A run of an env that names code to import resumes only with that env on the command line, so the
    resume advice gives it."""
    out = tmp_path / MARKED
    env, kwargs, code_wanted = {
        "error": ("tests.test_run_folder_safety:nan_reward_env", "{after = 40}", 3),
        "sigterm": ("tests.test_run_lifecycle:countdown_env", "{sigterm_at = 40}", 143),
        "second ctrl-c": ("tests.test_run_folder_safety:nan_reward_env", "{after = 100000, interrupt_at = 56}", 130),
    }[stop]
    code, stdout, stderr = _train([env, "--total-steps", "4096", "--checkpoint-every", "32", "--env.kwargs", kwargs,
                                   "--out", str(out)])
    assert code == code_wanted and "Traceback" not in stderr, stderr[-3000:]
    text = stdout + stderr
    assert "\x1b" not in text and "\u202e" not in text, repr(text[-2000:])
    checkpoint = f"{tmp_path}/{MARKED_SHOWN}/checkpoint"
    if stop == "error":
        assert f"the last good checkpoint is {checkpoint} (step " in stderr, stderr
    else:
        assert f"continue with: packrl train {env} --resume $'{tmp_path}/{MARKED_SHOWN}'" in stderr, stderr
        word = stderr.split("--resume ", 1)[1].split("\n", 1)[0]  # pasted into bash, it names the run folder
        pasted = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, text=True,
                                env={**os.environ, "LC_ALL": "C.UTF-8"})  # bash writes $'\u202e' in UTF-8
        assert pasted.stdout == str(out), (word, pasted)
    if stop == "second ctrl-c":
        assert f"the last checkpoint is {checkpoint} (step 32)" in stderr, stderr
