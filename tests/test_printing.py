"""packrl.printing.shown: the one function that prints user-controlled text."""
import io
import os
import subprocess
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from packrl.printing import shell_word, shown


def test_controls_and_lone_surrogates_are_escaped():
    assert shown("run\x1b[31m\ud800\u202e\n\x9b/é") == "run\\x1b[31m\\ud800\\u202e\\n\\x9b/é"


@given(st.text())
def test_any_text_prints_as_one_line_of_printable_utf8(text):
    out = shown(text)
    out.encode("utf-8")  # a lone surrogate would raise UnicodeEncodeError here
    assert "\n" not in out and "\x1b" not in out and "\r" not in out
    assert not any(unicodedata.category(c) in ("Cc", "Cs") for c in out)  # no control, no surrogate
    stream = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    print(out, file=stream)  # what print to a UTF-8 terminal does with it


@settings(max_examples=40)  # one bash per example
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1))
def test_a_shell_word_pasted_into_bash_gives_back_the_text(text):
    """shell_word: shlex's quoting, or bash's $'...' where the text holds control characters (the resume and
    wandb sync advice): pasted into bash, the word is the text again."""
    word = shell_word(text)
    assert "\n" not in word and "\x1b" not in word
    pasted = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True,
                            env={**os.environ, "LC_ALL": "C.UTF-8"})
    assert pasted.stdout.decode("utf-8") == text, (word, pasted.stderr)
