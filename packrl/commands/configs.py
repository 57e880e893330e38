"""``packrl configs [NAME]``: list the presets (settings per env family), which env ids choose each, what each
sets and where its numbers come from, or print one as a TOML config file (``packrl configs NAME``)."""
from __future__ import annotations

import argparse

from packrl import presets


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="print this preset as a TOML config file")


def run(args: argparse.Namespace) -> int:
    if args.name:
        print(presets.get(args.name).to_toml(), end="")
        return 0
    print("Presets, chosen from the env id (defaults < preset < --config file < flags; --preset NAME|none):")
    for preset in presets.PRESETS:
        print(f"\n{preset.name}: {preset.summary}")
        print(f"  env ids: {', '.join(preset.patterns)}")
        print(f"  sets:    {'  '.join(f'{key}={value}' for key, value in preset.items())}")
        print(f"  source:  {preset.source}")
    return 0
