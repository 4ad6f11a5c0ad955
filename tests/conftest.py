from __future__ import annotations

import textwrap
from pathlib import Path

import pytest


@pytest.fixture
def write_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write a recipe file `x.py` into tmp_path (the cwd, so errors show `x.py:LINE`); return its path."""
    monkeypatch.chdir(tmp_path)

    def write(text: str, name: str = "x.py") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return path

    return write
