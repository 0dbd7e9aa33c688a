"""Tier templates a what-if can add to any device (data files)."""
