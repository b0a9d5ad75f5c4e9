"""`python -m infra.cli`: the `warmstart` command without its console script (image builds use it)."""

import sys

from infra.cli import main

sys.exit(main())
