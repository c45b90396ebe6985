"""``python -m hpcppo.cli``: the ``hpcppo`` command."""

import sys

from hpcppo.cli import main

sys.exit(main())
