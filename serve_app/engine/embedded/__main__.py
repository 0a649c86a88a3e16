"""``python -m serve_app.engine.embedded``: see ``cli``."""

import sys

from serve_app.engine.embedded.cli import main

sys.exit(main())
