"""A run folder named with control characters and markup (``--out``) is printed escaped in the closing
``run folder:``, ``checkpoint:`` and ``learning curve:`` lines: nothing reaches the terminal raw, no markup
is eaten."""
import contextlib
import io

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
