"""Renderers: human (Rich), JSON, GitHub workflow commands, JUnit XML, HTML.

Only this package, ``ftkit.cli`` and ``ftkit.commands`` touch Rich. Machine formats are
written as plain text to stdout, never through Rich.
"""
