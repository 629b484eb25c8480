"""scripts/bench as a package: one module per step (see scripts/bench for the command line)."""
