"""crl.train (in progress)."""
