"""``python -m gpumem``: runs the course's command line and exits with its status."""

import sys

from .cli import main

sys.exit(main())
