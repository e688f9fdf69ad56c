"""JSON Schema → regex: normalization into keywords the backends enforce, the keyword-by-keyword
compiler to a regex for the automaton, bounded numbers and string formats. Pure functions over
schemas and strings: no tokenizer, no torch."""
