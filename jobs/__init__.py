"""jobs/: running jobs: the one queue on disk (store.py) that every way of starting a job adds to, its JSON-lines
files (jsonl.py), and the runner that runs it."""
