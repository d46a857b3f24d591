"""Tokens, certificates, and the key that seals secrets at rest."""
