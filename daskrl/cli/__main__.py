from daskrl.cli._app import main

raise SystemExit(main())
