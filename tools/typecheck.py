"""Run mypy on the installed names ferry.shard_tools, ferry.client and ferry.service.

The folders shard_tools/, client/ and service/ install under the ``ferry`` namespace (setuptools'
package-dir), which an editable install serves through an import hook that mypy does not run. This
script links the three folders under ``.mypy-tree/ferry/`` (git-ignored; ``mypy_path`` in
pyproject.toml) and runs mypy with the project's configuration. Usage: ``python tools/typecheck.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / ".mypy-tree" / "ferry"
PACKAGES = ("shard_tools", "client", "service")


def link_tree() -> None:
    """``.mypy-tree/ferry/<package>`` -> ``<package>/`` for each package (relative links, made once)."""
    TREE.mkdir(parents=True, exist_ok=True)
    for name in PACKAGES:
        link = TREE / name
        if not link.is_symlink():
            link.symlink_to(Path("..", "..", name), target_is_directory=True)


def main() -> int:
    link_tree()
    return subprocess.run([sys.executable, "-m", "mypy", *sys.argv[1:]], cwd=ROOT, env=os.environ).returncode


if __name__ == "__main__":
    sys.exit(main())
