"""The analyzer's rules, grouped by topic; each module registers its rules on import."""
