"""The outlines-core automaton: a regex compiled into a token-level index over one vocabulary
(grammar.py), its distance table for the budget rule (budget.py), and the per-request cursor
(guide.py); the index built in a child process that a timeout can kill (index_worker.py). The
only backend whose budget rule is exact."""
