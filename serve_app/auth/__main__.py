"""``python -m serve_app.auth`` is the operator CLI (same as ``serve-app-keys``)."""

import sys

from serve_app.auth.cli import main

sys.exit(main())
