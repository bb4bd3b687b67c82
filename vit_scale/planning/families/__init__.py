"""Each strategy family prediction rules in a module of its own (fsdp), called by the generic planners
in vit_scale.planning; families not yet moved keep theirs in memory.py and step_time.py."""
