"""`python -m areal.cli`: the `areal` command."""

from areal.cli import main

main()
