"""Demonstrations that train small models with refattn's own backward passes."""
