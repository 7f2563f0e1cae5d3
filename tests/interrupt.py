"""For tests that Ctrl-C a child process."""

import signal


def interruptible() -> None:
    """`preexec_fn` for a child a test will Ctrl-C: SIGINT back to its default. A shell without
    job control starts background jobs (`make test &` in a script, CI runners) with SIGINT
    ignored, every child inherits that, and Python then installs no KeyboardInterrupt handler:
    the Ctrl-C would never land and the test would wait out its timeout."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
