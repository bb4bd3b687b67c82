"""Run: what every run does whatever its recipe (process group, run directory, step meter, watcher,
end record, exit code) and what it measures (memory, replica agreement, device peaks)."""
