"""Second-stage scorers (late interaction, cross-encoder).

A leaf package: it imports neither ``retrieval`` nor ``index_builder``; it defines the small protocols it needs
and receives model runners from outside.
"""
