"""Session-wide test settings.

``FTKIT_STRICT_EVENTS=1``: every ``EventWriter`` made in the tests (and in the Ray workers
they start, which inherit the environment) checks each emitted event against the schema and
raises ``EventSchemaError`` at the ``emit`` call for an unknown type, a wrong field name or a
wrong field type, so a broken call site fails a fast test instead of a slow one. Set at import,
before any writer or Ray instance exists; a test that needs the production behaviour (never
raise) removes it with ``monkeypatch.delenv``.
"""

import os

os.environ["FTKIT_STRICT_EVENTS"] = "1"
