"""crl.data (in progress)."""
