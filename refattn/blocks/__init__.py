"""Family 5: transformer building blocks beyond the primitives in :mod:`refattn.nn`.

One module per block (feed-forward variants, residual schemes, gating, token mixers,
initialisation schemes ...). A block that wraps attention takes the attention mechanism as a
registry slug or a forward/backward pair and chains its backward through it.
"""
