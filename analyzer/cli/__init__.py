"""The analyzer's commands, one module each: ``analyze`` (analyze, demo, evaluate), ``serve``,
``report``. Each exposes ``register(subparsers)``; heavy imports stay inside the functions so
``truegpu --help`` and the exporter never load pandas.
"""
