"""ftkit's version: the one place it is written (``ftkit.__version__`` is this value).

A module of its own, below everything, so that the parts which record it (``run.json``, the
``run_started`` event, dump indexes) import it without importing the ``ftkit`` package's lazy
public API, which imports them.
"""

__version__ = "0.1.0"
