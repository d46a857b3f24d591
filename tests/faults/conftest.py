"""Fault tests: real processes, SIGKILL, network namespaces; shared tooling in scripts/faultlib.py."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
