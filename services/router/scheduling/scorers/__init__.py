"""Scorers: one signal each, higher is better, 0..1 (the framework clamps and weights)."""
