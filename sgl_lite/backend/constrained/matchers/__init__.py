"""The grammar backends' matchers: llguidance and xgrammar behind the Guide protocol, their shared
cursor base (grammar_guide.py), bitmask unpacking (grammar_mask.py) and the deterministic closer
that keeps their budget (closer.py). The libraries themselves are imported on first use."""
