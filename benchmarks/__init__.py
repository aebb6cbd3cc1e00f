"""GPU benchmarks (BENCHMARKS.md says what each measures and the commands). Run from the repository root as
`python3 -m benchmarks.<name> ...`, or after `pip install -e .` from anywhere; `python3 benchmarks/<name>.py` works
too (benchmarks/_script.py)."""
