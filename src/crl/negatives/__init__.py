"""crl.negatives (in progress)."""
