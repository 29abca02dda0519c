"""`python -m stackwise`: the same CLI as the `stackwise` command."""

from stackwise.cli import main

raise SystemExit(main())
