"""pyproject.toml builds without setuptools' deprecation warnings (the license as an SPDX string)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the metadata step of `pip install -e .`, with setuptools' deprecations as errors
PREPARE = """
import sys
import warnings
from setuptools import build_meta
from setuptools.warnings import SetuptoolsDeprecationWarning
warnings.simplefilter("error", SetuptoolsDeprecationWarning)
print(build_meta.prepare_metadata_for_build_editable(sys.argv[1]))
"""


def test_editable_metadata_builds_without_deprecations(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", PREPARE, str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metadata = (tmp_path / result.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
