"""``python -m rllib_search``: the ``rllib-search`` command line (``rllib_search/cli.py``)."""

from __future__ import annotations

import sys

from rllib_search.cli import main

if __name__ == "__main__":
    sys.exit(main())
