"""Checkpoints, one package: the layout the trainer writes and eval reads, local or under an fsspec
URL (``layout``), the cached and node-local copies of a URL checkpoint (``copies``), peft's adapter
file names (``adapter_names``), the reference trainer's FSDP checkpoints read as a team
(``verl``) and merged shard by shard (``verl_merge``), and a checkpoint's team exported as plain
folders (``export``). It sits below ``models/`` and ``workflows/``: it imports neither."""
