"""Search and evaluation at a fixed sampling budget: given n samples per problem, how often does
one of k succeed (pass@k), does the majority answer win (maj@k), and which sample would a scorer
pick (best-of-n, weighted majority). Kept apart from training so that evaluation scripts and
test-time search can use it without torch.
"""
