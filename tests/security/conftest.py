"""Security tests: the auth matrix, hostile input, fuzzing, TLS and the explorer's read-only promise."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
