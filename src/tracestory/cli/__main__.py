"""``python -m tracestory.cli``: the same as the ``tracestory`` command."""

import sys

from . import main

sys.exit(main())
