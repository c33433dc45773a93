"""Guarantees a cold adversarial review broke, each kept as its regression test."""
