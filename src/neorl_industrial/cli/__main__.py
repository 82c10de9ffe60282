"""``python -m neorl_industrial.cli`` runs the command line."""

import sys

from neorl_industrial.cli import main

sys.exit(main())
