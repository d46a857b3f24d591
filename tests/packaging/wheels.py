"""Build this checkout's wheel and run what a venv installed from it: shared by tests/packaging."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _checkout_files() -> list[str]:
    done = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"not a git checkout: {done.stderr.strip()}")
    return [name for name in done.stdout.splitlines() if (ROOT / name).exists() or (ROOT / name).is_symlink()]


def _copy_checkout(dest: Path) -> None:
    for name in _checkout_files():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        source = ROOT / name
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)


def build_wheel(work: Path) -> Path:
    """The wheel of this checkout, built from a copy of its files (so the checkout gets no build/ folder)."""
    source, dist = work / "source", work / "dist"
    _copy_checkout(source)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(dist), str(source)], check=True, capture_output=True, timeout=300)
    wheels = list(dist.glob("gpulayer-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def venv_env(venv: Path, **extra: str) -> dict:
    """This environment without GPULAYER_* and PYTHONPATH, the venv's bin first on PATH, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_") and k != "PYTHONPATH"}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env
