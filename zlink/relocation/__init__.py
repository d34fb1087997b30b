"""Moving Spots and Actors between nodes (kotlin-spot-interface relocation; §4, §14).

``relocator.py`` holds the order of a move and what a call that meets one does; ``source.py``
the side a move leaves (seal, barrier, capture, ship, commit), ``target.py`` the side it
arrives on (restore, refill, open), ``state.py`` the records both keep, ``remote_join.py`` a
cross-node Join (a move of one held Actor). Policies and adapters users name are in
``zlink.adapters``. This package sits above ``zlink.runtime`` and beside ``zlink.mesh``.
"""
