"""The `relay` command line: one parser for every subcommand, and the exit codes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from relay.errors import RelayError
from relay_cli import demo, impact, store


def build_parser() -> argparse.ArgumentParser:
    """`relay demo|seed|lineage|alias|store|impact`, each subcommand bound to the function it runs."""
    parser = argparse.ArgumentParser(
        prog="relay",
        description="Relay: the demo, seeding, and read-only looks into the model store.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo.add_commands(sub)
    store.add_commands(sub)
    impact.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; a RelayError is one line on stderr and exit code 1."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except RelayError as exc:
        print(f"relay: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
