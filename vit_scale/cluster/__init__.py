"""What `vit-scale study` and `vit-scale check` share, below both: the cluster they run on (system
profiles, launchers, supervision) and the reading of their options and files. Torch is never
imported here: both orchestrators run on a login node or beside the ranks they start.

    systems.py    a system profile (configs/systems/), its default study file, and what this
                  machine or Slurm allocation gives
    launchers.py  one launch -> the argument lists that start its ranks
    supervise.py  start them, wait, stop the whole tree on a failure, a time limit or a signal
    options.py    a command line as (option, value) pairs; --prog, the name a job script gives
    values.py     whole numbers, minutes, lists and booleans of options and study files
    files.py      the repository's configs/ and reading their YAML

Bad input anywhere here is one vit_scale.errors.UserError line naming the option; the commands
print it after their name and exit 2.
"""
