"""``hpcppo import-verl``: a verl run script or YAML read as verl reads it, translated to an hpcppo experiment spec.

``read`` (a run script as bash expands it: ``shell`` and ``lex``; a YAML as OmegaConf reads it; ``--config-name``),
``importer`` (the translation, the report, ``docs/verl.md``), and ``names``: the table of verl's keys in hpcppo terms,
a leaf that imports nothing of ``config``, so that ``config`` itself can name verl's keys (did-you-mean, ``-o`` with a
verl name, ``config explain``). This ``__init__`` imports none of them: ``config`` imports ``verl.names`` without
pulling in the importer, which imports ``config``.
"""
