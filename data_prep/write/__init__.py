"""Outputs: shards.py (Megatron .bin/.idx), rejects.py (reject log), manifest.py (per-unit stats -> manifest.json),
verify.py (check shards against the manifest), merge.py (fewer, larger shards), blend.py (weighted sources)."""
