"""Emulation: any gymnasium or PettingZoo space as packed uint8 rows described by a Layout."""
from packrl.emulation.actions import ActionLayout
from packrl.emulation.codecs import BoundedString, Field, LeafCodec, TextView, bounded_string, register_space
from packrl.emulation.emulate import emulate
from packrl.emulation.emulated import Emulated, Group
from packrl.emulation.layout import BoundRows, Layout, Leaf

__all__ = ["ActionLayout", "Emulated", "Group", "emulate", "BoundRows", "BoundedString", "Field", "Layout", "Leaf", "LeafCodec", "TextView",
           "bounded_string", "register_space"]
