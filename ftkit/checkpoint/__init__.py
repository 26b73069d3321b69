"""Guarded, verifiable checkpoints (DESIGN.md I4): the non-finite guard, the publication flow,
the manifest, retention through an intent journal, and the fail-closed verifier.

Layout, manifest, journal, phases and the FT2xx rules: docs/checkpoints.md.
"""
