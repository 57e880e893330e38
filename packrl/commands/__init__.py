"""One module per ``packrl`` subcommand: ``add_arguments(parser)`` declares its own options and ``run(...)``
does the work and returns the exit status. ``packrl/cli.py`` builds the parser and the config they share."""
