"""``python -m dynamo.planner.lab``."""

import sys

from dynamo.planner.lab.cli import main

sys.exit(main())
