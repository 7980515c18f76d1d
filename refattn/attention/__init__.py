"""Attention mechanisms, one module per family (softmax, differential, linear/kernel …)."""
