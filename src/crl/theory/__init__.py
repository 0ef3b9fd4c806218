"""crl.theory (in progress)."""
