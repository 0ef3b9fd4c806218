"""The single-module studies: ``crl study calibration`` (calibration), ``crl study imbalance``
(imbalance) and ``crl study gcl`` (gcl), each a :class:`~crl.experiments.study.Study` in one file;
the negatives study, ten modules, is its own package (:mod:`crl.experiments.negatives`).
"""
