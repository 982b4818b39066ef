"""`python -m orchestrator.simulator [sglang serve flags] [simulator flags]` (see the package docstring)."""

import sys

from orchestrator.simulator.server import main

sys.exit(main())
