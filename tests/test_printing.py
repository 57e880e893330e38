"""packrl.printing.shown: the one function that prints user-controlled text."""
import io
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from packrl.printing import shown


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
