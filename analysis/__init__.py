"""vit-scale analysis: run directories in, tables, plots and a report out.

This package must stay importable on a login node that has only numpy, pandas, pyyaml and
matplotlib: it never imports torch or vit_scale (tests/test_analysis.py checks). The run
directory format it reads is docs/run_record.md; the only schema it knows is
`records.SUPPORTED_SCHEMA`.
"""
