"""``python -m hybridrag``: the same as the ``hybridrag`` console script."""

import sys

from hybridrag.cli import main

sys.exit(main())
