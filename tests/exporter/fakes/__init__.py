"""Test-only stand-ins. The only one allowed is the fake pynvml (tests/exporter/fakes/fake_pynvml.py)."""
