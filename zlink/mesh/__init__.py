"""Several nodes: where each Spot lives (``location.py``) and how nodes talk (``transport.py``).

The in-memory store and the in-process transport are the embedded defaults; both sit behind
interfaces so a shared store and a network transport can replace them without touching the
object model (execution-model §14). ``sqlite_store.py`` is the shared store of the processes
of one machine, ``redis_store.py`` that of processes on several machines (the ``redis``
extra); ``stores.open_store(url)`` picks a store from its URL (python-api §10).
``zmq_transport.py`` is the network transport; on its client port, ``client_server.py`` serves
``zlink.connect`` clients (``client.py``), in the frames of ``client_wire.py`` (python-api §10).
"""
