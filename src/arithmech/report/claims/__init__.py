"""The paper's claims, one module per claim (its id as the module's name: its record `CLAIM`, its thresholds, its
rule's text, its verdict `score` and the registry's entry `rows`), the logic several claims share (common.py), and
the registry (registry.py) that lists them in the scorecard's order and builds the claims table."""
