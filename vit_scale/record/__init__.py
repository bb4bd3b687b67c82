"""The run record (docs/run_record.md): its writer, its JSON Schema, the one torch-free reader the
analysis and the job tooling use, and the versions every start record carries; and the reader of a
study's check.json (check_file), which the analysis reads beside the runs."""
