"""`python -m stackwise.cli`: the same as the `stackwise` command."""

import sys

from stackwise.cli import main

sys.exit(main())
