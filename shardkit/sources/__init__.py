"""Source discovery: which input files are samples, with which label, group and given split.

- :mod:`.items`: :class:`~.items.SourceItem` / :class:`~.items.ScanResult` and the naming rules
  every source kind shares;
- :mod:`.folder`: an ImageFolder tree (``<class>/`` or ``<split>/<class>/``);
- :mod:`.csvlist`: a ``.csv`` list, and metadata CSV joins (group and split columns);
- :mod:`.remote`: an object-store prefix or a remote ``.csv``;
- :mod:`.layouts`: which folders are splits, which are classes, and class order;
- :mod:`.groups`: group rules by regex on the relative path;
- :mod:`.labels`: class names, aliases and label indices (:class:`~.labels.LabelMap`).
"""
