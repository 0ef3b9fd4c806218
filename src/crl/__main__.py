"""``python -m crl`` (and ``torchrun -m crl``) runs the command line."""

from crl.cli import main

if __name__ == "__main__":
    main()
