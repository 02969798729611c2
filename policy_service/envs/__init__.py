"""Environments made here: Atari with DeepMind's preprocessing."""
