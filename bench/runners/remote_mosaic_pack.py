"""Runner: ``mosaic_pack.py`` with the torchvision stand-in of ``remote_mosaic.py`` (where the peers' venv has
a torchvision that does not match its torch). Peers' venv."""

from __future__ import annotations

import remote_mosaic  # noqa: F401 — applies the stand-in before streaming is imported
from mosaic_pack import main

if __name__ == "__main__":
    main()
