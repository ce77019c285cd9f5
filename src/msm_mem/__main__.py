"""``python -m msm_mem`` runs the command line."""

import sys

from .interfaces.cli import main

sys.exit(main())
