"""The ``truegpu`` command line; each subcommand lives next to the code it drives."""
