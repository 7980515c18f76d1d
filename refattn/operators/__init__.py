"""Operator-learning attention and neural-operator layers."""
