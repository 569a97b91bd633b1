"""``python -m inttrain`` runs the command-line interface."""

from inttrain.cli.app import main

raise SystemExit(main())
