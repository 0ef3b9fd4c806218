"""crl.eval (in progress)."""
