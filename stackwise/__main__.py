"""`python -m stackwise`: the same CLI as the `stackwise` command."""

from stackwise.cli import run

run()
