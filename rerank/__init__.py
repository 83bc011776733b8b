"""Second-stage scorers (late interaction, cross-encoder).

A leaf package but for the token codecs it scores (``index_builder.snapshot``): it imports no ``retrieval`` and no
model runtime; the scores and vectors it works on come from outside.
"""
