"""`python -m stackwise.cli`: the same as the `stackwise` command."""

from stackwise.cli import run

run()
