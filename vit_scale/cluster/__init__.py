"""What `vit-scale study` and `vit-scale check` share: the cluster under them (system profiles,
launchers, supervision) and the reading of their options and files. Torch is never imported here."""
