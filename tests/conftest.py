"""Session-wide test settings.

``FTKIT_STRICT_EVENTS=1``: every ``EventWriter`` made in the tests (and in the Ray workers
they start, which inherit the environment) checks each emitted event against the schema and
raises ``EventSchemaError`` at the ``emit`` call for an unknown type, a wrong field name or a
wrong field type, so a broken call site fails a fast test instead of a slow one. Set at import,
before any writer or Ray instance exists; a test that needs the production behaviour (never
raise) removes it with ``monkeypatch.delenv``.

``real_train_run`` and ``real_fault_run`` (``tests/tamper_run.py``): small real runs, one each per
session, for the suites that copy and tamper with a real run; registered here so each is made
once, not once per module.
"""

import os

from tamper_run import real_fault_run, real_train_run  # noqa: F401  (session fixtures, registered once)

os.environ["FTKIT_STRICT_EVENTS"] = "1"


def pytest_collection_modifyitems(config, items):
    """Tests marked ``full`` run only in the full suite (``tests/suite.py``)."""
    import pytest
    from suite import FULL, SKIP_REASON

    if FULL:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if item.get_closest_marker("full") is not None:
            item.add_marker(skip)
