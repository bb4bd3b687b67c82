"""vit-scale analysis: run directories in, tables, plots and a report out.

This package must stay importable on a login node that has only numpy, pandas, pyyaml and
matplotlib: it never imports torch (tests/test_analysis.py checks). It reads run records only
through `vit_scale.record.reader` (docs/run_record.md) and takes strategy labels and layouts from
`vit_scale.distributed`; both are torch-free.
"""
