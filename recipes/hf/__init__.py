"""Hugging Face interop: name/shape conversion (`convert`), export, import."""
