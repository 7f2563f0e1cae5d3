"""`python -m helpers.suite`: every notebook headless, in order, then the report."""

import sys

from .runner import main

sys.exit(main(sys.argv[1:]))
