"""``python -m rlpost``: the same command line as ``rlpost``."""

import sys

from rlpost.cli import main

sys.exit(main())
