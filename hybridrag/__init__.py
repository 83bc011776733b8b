"""The ``hybridrag`` command line: the composition root that wires every component (the service in
``retrieval``, the offline build in ``index_builder``, ``training`` and ``bench``). No other package imports it."""
