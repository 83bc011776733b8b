"""The subcommands, one module per family: each ``cmd_*`` takes the parsed arguments (:mod:`hybridrag.parser`
declares them) and returns the exit status. Only here, in :mod:`hybridrag.parser` and in :mod:`hybridrag.cli` are
config files and the environment read."""
