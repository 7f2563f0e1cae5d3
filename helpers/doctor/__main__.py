"""`python -m helpers.doctor script.py`: see helpers/doctor/cli.py."""

import sys

from .cli import main

sys.exit(main())
