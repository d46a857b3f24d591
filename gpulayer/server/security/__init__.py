"""Tokens and certificates."""
