"""The packer: :func:`shardkit.pack` and ``shardkit pack``, one module per step.

The public function is :func:`shardkit.pack` (defined in :mod:`.run`); this package is not named
``pack`` so that importing it never replaces that function on the ``shardkit`` package.

- :mod:`.options`: :class:`~.options.PackOptions`, every option validated once;
- :mod:`.shards`: the default shard plan (pure);
- :mod:`.scan`: steps 1-2, scan the source and resolve labels;
- :mod:`.check`: step 3, check every file (the per-file worker function :func:`~.check.check_chunk`);
- :mod:`.records`: the check records, held in columns between steps 3 and 6;
- :mod:`.assign`, :mod:`.given`, :mod:`.split`: step 4, the split plan (pure);
- :mod:`.outputs`: the output of a run, a local folder or an object-store prefix (one interface);
- :mod:`.write`: steps 5-7, quarantine list, shards (the per-shard worker function
  :func:`~.write.write_shard`), split files, manifest;
- :mod:`.engines`: where steps 3 and 6 run, :class:`~.engines.LocalEngine` or
  :class:`~.engines.RayEngine` (chosen once by :func:`~.run.pack`);
- :mod:`.summary`: :class:`~.summary.PackSummary`;
- :mod:`.run`: :func:`~.run.pack`, the driver of the steps; :mod:`.cli`: ``shardkit pack``.
"""
