"""Layout.from_json / from_dict on malformed documents: every one raises packrl's EmulationError
(never KeyError, TypeError, AttributeError, JSONDecodeError, OverflowError, MemoryError or an
assertion from gymnasium), from a table of hand-made mutations and from hypothesis' random ones."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given
from hypothesis import strategies as st

from packrl import EmulationError
from packrl.emulation import Layout

SPACE = spaces.Dict({
    "box": spaces.Box(-1, np.array([1, 2], np.float32), (2,), np.float32),
    "int": spaces.Box(0, 9, (2, 2), np.int16),
    "flag": spaces.Box(0, 1, (3,), bool),
    "choice": spaces.Discrete(5, start=2),
    "nested": spaces.Tuple((spaces.MultiDiscrete([3, 4]), spaces.MultiBinary(3), spaces.Text(4, charset="abc"))),
})
LAYOUT = Layout.from_space(SPACE)
DOC = LAYOUT.to_dict()


def leaf(doc, key):
    return next(c for k, c in doc["tree"]["dict"] if k == {"str": key})["leaf"]


def nested(doc, i):
    return next(c for k, c in doc["tree"]["dict"] if k == {"str": "nested"})["tuple"][i]["leaf"]


def mutate(fn):
    doc = copy.deepcopy(DOC)
    fn(doc)
    return doc


def setitem(get, key, value):
    def apply(doc):
        get(doc)[key] = value
    return apply


def delitem(get, key):
    def apply(doc):
        del get(doc)[key]
    return apply


ROOT = lambda d: d  # noqa: E731
TREE = lambda d: d["tree"]  # noqa: E731
BOX = lambda d: leaf(d, "box")  # noqa: E731
INT = lambda d: leaf(d, "int")  # noqa: E731
CHOICE = lambda d: leaf(d, "choice")  # noqa: E731
MULTI = lambda d: nested(d, 0)  # noqa: E731
TEXT = lambda d: nested(d, 2)  # noqa: E731

TEXTS = {
    "not JSON": "{",
    "empty": "",
    "a list": "[]",
    "null": "null",
    "a number": "1e999",
    "a string": '"layout"',
    "NaN": "NaN",
    "deep nesting": '{"tree": ' + '{"tuple": [' * 5000 + "]}" * 5000 + "}",
    "huge int": '{"tree": {"leaf": {"kind": "discrete", "n": ' + "9" * 5000 + ', "start": 0, "dtype": "<i8"}}}',
}

DOCS = {
    "no tree": delitem(ROOT, "tree"),
    "tree null": setitem(ROOT, "tree", None),
    "tree a list": setitem(ROOT, "tree", []),
    "tree empty": lambda d: d.update(tree={}),
    "tree two keys": lambda d: d["tree"].update(tuple=[]),
    "tree unknown key": lambda d: d.update(tree={"set": []}),
    "dict not a list": lambda d: d["tree"].update(dict=5),
    "dict entry not a pair": lambda d: d["tree"]["dict"].__setitem__(0, [1]),
    "dict entry a string": lambda d: d["tree"]["dict"].__setitem__(0, "ab"),
    "dict key a list": lambda d: d["tree"]["dict"][0].__setitem__(0, []),
    "dict key two tags": lambda d: d["tree"]["dict"][0].__setitem__(0, {"str": "a", "int": 1}),
    "dict key unhashable": lambda d: d["tree"]["dict"][0].__setitem__(0, {"str": [1, 2]}),
    "dict key unknown tag": lambda d: d["tree"]["dict"][0].__setitem__(0, {"bytes": "box"}),
    "tuple not a list": lambda d: next(c for k, c in d["tree"]["dict"] if k == {"str": "nested"}).update(tuple=3),
    "leaf null": lambda d: d["tree"]["dict"][0].__setitem__(1, {"leaf": None}),
    "leaf a string": lambda d: d["tree"]["dict"][0].__setitem__(1, {"leaf": "box"}),
    "leaf no kind": delitem(BOX, "kind"),
    "leaf kind unknown": setitem(BOX, "kind", "sphere"),
    "leaf kind a list": setitem(BOX, "kind", []),
    "box no dtype": delitem(BOX, "dtype"),
    "box dtype bogus": setitem(BOX, "dtype", "zz"),
    "box dtype object": setitem(BOX, "dtype", "|O"),
    "box dtype a number": setitem(BOX, "dtype", 4),
    "box shape a string": setitem(BOX, "shape", "ab"),
    "box shape negative": setitem(BOX, "shape", [-1]),
    "box shape float": setitem(BOX, "shape", [2.0]),
    "box shape huge": setitem(BOX, "shape", [10**30]),
    "box shape gigabytes": setitem(BOX, "shape", [100000, 100000]),
    "box low missing": delitem(BOX, "low"),
    "box low empty": setitem(BOX, "low", {}),
    "box low fill a word": setitem(BOX, "low", {"fill": "low"}),
    "box low values too few": setitem(BOX, "low", {"values": [0.0]}),
    "box low values nested": setitem(BOX, "low", {"values": [[0.0], [1.0]]}),
    "box low a number": setitem(BOX, "low", 0),
    "box high fill null": setitem(BOX, "high", {"fill": None}),
    "int bounds beyond int16": setitem(INT, "high", {"fill": 10**6}),
    "int low above high": setitem(INT, "low", {"fill": 12}),
    "discrete n zero": setitem(CHOICE, "n", 0),
    "discrete n a string": setitem(CHOICE, "n", "five"),
    "discrete n infinite": setitem(CHOICE, "n", float("inf")),
    "discrete start missing": delitem(CHOICE, "start"),
    "discrete dtype float": setitem(CHOICE, "dtype", "<f8"),
    "multidiscrete nvec zero": setitem(MULTI, "nvec", {"fill": 0}),
    "multidiscrete nvec a list": setitem(MULTI, "nvec", [3, 4]),
    "text charset a number": setitem(TEXT, "charset", 5),
    "text max below min": setitem(TEXT, "min_length", 9),
    "text max_length negative": setitem(TEXT, "max_length", -1),
    "leaves removed": delitem(ROOT, "leaves"),
    "nbytes changed": setitem(ROOT, "nbytes", 1),
    "offset changed": lambda d: d["leaves"][0].update(offset=3),
}


@pytest.mark.parametrize("name", list(TEXTS))
def test_malformed_text_is_refused(name):
    with pytest.raises(EmulationError, match="layout JSON"):
        Layout.from_json(TEXTS[name])


@pytest.mark.parametrize("name", list(DOCS))
def test_malformed_document_is_refused(name):
    doc = mutate(DOCS[name])
    with pytest.raises(EmulationError, match="layout JSON|leaf"):
        Layout.from_dict(doc)
    with pytest.raises(EmulationError):
        Layout.from_json(json.dumps(doc))


def test_the_document_itself_reads_back():
    again = Layout.from_json(LAYOUT.to_json())
    assert again == LAYOUT and Layout.from_dict(copy.deepcopy(DOC)) == LAYOUT


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6)


def _places(obj, at=()):
    """Every (container path, key) of a JSON document."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield at + (k,)
        yield from _places(v, at + (k,))


PLACES = list(_places(DOC))


@given(st.lists(st.tuples(st.sampled_from(PLACES), JSON_VALUES, st.booleans()), min_size=1, max_size=3))
def test_random_mutations_raise_only_emulation_errors(edits):
    doc = copy.deepcopy(DOC)
    for place, value, delete in edits:
        container = doc
        try:
            for k in place[:-1]:
                container = container[k]
            if delete and isinstance(container, dict):
                del container[place[-1]]
            else:
                container[place[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed or replaced this place
    try:
        layout = Layout.from_dict(doc)
    except EmulationError:
        return
    assert layout.to_dict() == doc  # what is accepted is exactly a layout's own document
