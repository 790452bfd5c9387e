"""Test support shared by the test folders: helpers, not tests."""
