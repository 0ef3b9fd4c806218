"""crl.experiments (in progress)."""
