"""`python -m sandbox.task SPEC -- CMD...`: see sandbox.task.launcher."""

import sys

from .launcher import main

sys.exit(main())
