"""`python -m hasten` (what torchrun launches) is the `hasten` command."""

from hasten.cli import run

run()
