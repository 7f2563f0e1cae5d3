"""`python -m helpers.suite`: every notebook headless, in order, then the report."""

from .runner import main

raise SystemExit(main())
