"""fastdata's benchmarks: every runner in this folder, its registry (`registry.py`) and the harness that runs them
by suite and keeps their results as JSON (`python -m benchmarks`, `__main__.py`). Not part of the installed
package: nothing in fastdata imports from here."""
