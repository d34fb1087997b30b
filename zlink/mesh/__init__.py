"""Several nodes: where each Spot lives (``location.py``) and how nodes talk (``transport.py``).

The in-memory store and the in-process transport are the embedded defaults; both sit behind
interfaces so a shared store and a network transport can replace them without touching the
object model (execution-model §14).
"""
