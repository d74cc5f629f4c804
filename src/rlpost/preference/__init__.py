"""Learning from preferences and demonstrations rather than from a verifier's reward: ``data.py``
reads SFT and preference rows into the same ``Rollouts`` batch the RL trainer uses (a pair is a
group of two rows), and ``losses.py`` holds the offline objectives (DPO, cDPO, IPO, KTO, ORPO,
SimPO, the Bradley-Terry reward-model loss) as pure functions of per-sequence log-probs, each
returning ``(loss, metrics)`` and unit-tested with hand-worked numbers in tests/preference/."""
