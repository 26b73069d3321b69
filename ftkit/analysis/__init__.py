"""Findings and the rules that produce them (analyze-events); the findings model is shared by
every reporting command (compare-dumps, verify-checkpoint)."""
