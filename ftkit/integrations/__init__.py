"""Integrations of the evidence API with other trainers (each imports its trainer on first use)."""
