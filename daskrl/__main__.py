"""``python -m daskrl``: the ``daskrl`` command (:func:`daskrl.cli.main`)."""

from daskrl.cli._app import main

raise SystemExit(main())
