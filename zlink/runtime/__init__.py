"""One node's object model: live Spots, Actors and Channels, and how a call reaches them.

``directory.py`` (what the node holds), ``runtime.py`` (delivery: validate, resolve, deliver),
``creation.py``, ``membership.py`` (Defer, Join, leave), ``closing.py``, ``jobs.py`` (work items
on owner lanes), ``acts.py`` (activations), ``routing.py`` (calls for other nodes, fences).
Above ``zlink.messaging`` and the executor; below ``zlink.relocation`` and ``zlink.node``.
"""
