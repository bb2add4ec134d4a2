"""Scoring (one device or every rank) and the cached evaluation steps."""
