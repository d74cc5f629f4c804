"""Metrics at a fixed sampling budget: given n samples per problem, how often does one of k
succeed (pass@k), does the majority answer win (maj@k), and which sample would a scorer pick
(best-of-n, weighted majority). Pure Python, no torch; the searches that sample (best-of-N,
PRM beam search) are in ``recipes/search.py``.
"""
