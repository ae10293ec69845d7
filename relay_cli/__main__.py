"""`python -m relay_cli …`: the `relay` console command without the installed script."""

from relay_cli.main import main

raise SystemExit(main())
