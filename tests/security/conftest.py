"""Security tests: the auth matrix, hostile input, fuzzing, TLS and the explorer's read-only promise."""
