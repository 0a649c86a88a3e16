"""``python -m serve_app.models.embedded``: see ``cli``."""

import sys

from serve_app.models.embedded.cli import main

sys.exit(main())
