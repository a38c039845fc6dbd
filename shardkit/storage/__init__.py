"""Storage primitives of the write side, below everything that packs or reads.

- :mod:`.urls`: the URL rule (remote fsspec URL or local path, ``file://`` URLs) and reads of
  one location, local or remote;
- :mod:`.atomic`: crash-safe file writes (temp name, fsync, rename) and ``fsync_dir``;
- :mod:`.fetch`: reading many source files whose bytes may live in object storage, GETs in flight;
- :mod:`.procs`: process helpers (a child that dies with its parent; is a pid alive).
"""
