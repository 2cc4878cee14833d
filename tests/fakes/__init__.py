"""Test-only stand-ins. The only one allowed is the fake pynvml (tests/fakes/fake_pynvml.py)."""
