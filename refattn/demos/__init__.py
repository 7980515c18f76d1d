"""Small, self-contained demonstrations built on refattn's reference functions (NumPy only).

They are used by the tutorials; each module states what it shows, how its weights are obtained
(trained with refattn's own backward passes and :class:`refattn.optim.Adam`, or constructed by
hand) and what measurable claim its test checks.

* :mod:`refattn.demos.retrieval` — synthetic key retrieval with distractors: plain softmax
  attention vs differential attention, attention maps for heat maps.
"""
