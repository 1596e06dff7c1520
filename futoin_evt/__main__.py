"""``python -m futoin_evt``."""

import sys

from .cli import main

sys.exit(main())
