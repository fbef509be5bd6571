"""`python -m exactlens`: the exactlens command line."""

from exactlens.cli import main

raise SystemExit(main())
