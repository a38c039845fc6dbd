"""A packed dataset on disk: the contract between the packer and every reader.

- :mod:`.schema`: the schema of ``manifest.json`` and of split records, checked on load;
- :mod:`.manifest`: ``manifest.json`` and the per-split index, written and loaded in one place;
- :mod:`.writer_config`: the manifest's ``writer`` section (the options that decided the stored
  bytes), which readers and interop rebuild from;
- :mod:`.swap`: the dataset folder's lock and the crash-safe swap of ``pack --overwrite``
  (rolled forward by :func:`.manifest.load_manifest`).
"""
