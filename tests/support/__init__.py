"""Shared test support: real-text corpora (`corpus`), training-run helpers (`runs`), launcher helpers (`launch`), the
loopback sshd (`loopback_ssh`, also a command: two loopback "nodes" around any command). Imported as `tests.support.*`
(pytest.ini puts the repository root on sys.path)."""
