"""``python -m labkit.preflight``: the same as ``labkit doctor``."""

from labkit.preflight import main

raise SystemExit(main())
