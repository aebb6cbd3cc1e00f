"""cli/: the command line, `python -m cli generate | batch | resume | queue` (console script `steadyframe-cli`)."""
