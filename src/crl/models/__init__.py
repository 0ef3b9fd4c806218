"""crl.models (in progress)."""
