"""The machinery that runs the notebooks and writes the report; the notebooks only record into
it (`from helpers.suite import results`). `python -m helpers.suite` runs the suite
(`runner.main`). The map of both packages is in `helpers/__init__.py`."""
