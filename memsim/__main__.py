"""``python -m memsim``: the same command line as the ``memsim`` script."""

import sys

from memsim.cli import main

sys.exit(main())
