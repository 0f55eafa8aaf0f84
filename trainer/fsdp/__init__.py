"""Sharded worker groups (FSDP2): the process group and sharding (``sharding``), a group's ranks as
one ``WorkerGroup`` (``worker``), their placement as Ray actors (``ray_group``) and the sharded
optimiser state in a checkpoint (``checkpoint``)."""
