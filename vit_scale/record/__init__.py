"""The run record (docs/run_record.md): its writer, its JSON Schema, the one torch-free reader the
analysis and the job tooling use, and the versions every start record carries."""
