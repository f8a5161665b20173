"""`python -m arithmech.tools.plan [CONFIG ...] [options]` (make plan): see `arithmech.tools.plan.cli.main`."""

import sys

from arithmech.tools.plan.cli import main

sys.exit(main())
