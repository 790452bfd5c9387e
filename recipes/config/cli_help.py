"""Help of the recipes commands: a description made of whole sentences and examples to copy.

A command's description is its module docstring's first paragraph, all of it: the docstrings wrap at 120 columns,
so their first *line* is often half a sentence ("... as a training"). Examples follow the options, as typed.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Sequence

WIDTH = 100


def refuse(problem) -> int:
    """The one ending of a command the user must fix (a bad recipe, path, checkpoint, argument): `error: <problem>` on
    stderr, one message naming the fix, no traceback; the exit code 2 that every command uses for it."""
    print(f"error: {problem}", file=sys.stderr)
    return 2


def first_paragraph(doc: str) -> str:
    """The text up to the first blank line, as one paragraph."""
    return " ".join(doc.strip().split("\n\n", 1)[0].split())


def command_parser(prog: str, doc: str, examples: Sequence[str] = ()) -> argparse.ArgumentParser:
    """An ArgumentParser whose description is the whole first paragraph of `doc` and whose epilog lists `examples`
    (each a command line, optionally followed by '  # why')."""
    epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples) if examples else None
    return argparse.ArgumentParser(prog=prog, description=textwrap.fill(first_paragraph(doc), WIDTH), epilog=epilog,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def count(least: int = 1):
    """argparse type for a count: a whole number of at least `least`, refused by the parser naming the value
    (`recipes train --local 0` started no launcher and ran as a lone rank, dying with a torch.distributed traceback),
    e.g. `ap.add_argument("--local", type=count(1))`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"wants a whole number of at least {least}, got {text!r}")
        return value

    parse.__name__ = "count"
    return parse
