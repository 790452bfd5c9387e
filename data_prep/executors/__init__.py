"""Executors run work units and know nothing of what a unit's task does (see base.py for the interface)."""
