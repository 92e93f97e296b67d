"""Shape and structure: views (``unsqueeze``/``expand``/``permute``/``transpose``/``view``/
``select``/``slice``/``cat``/``stack``/``diagonal``, ``views.py``), metadata queries
(``metadata.py``), ``reshape``/``flatten``/``unflatten``/the ``split`` family/``narrow``
(``reshape.py``), merging and splitting ragged dims (``flatten.py``, NOTE [ Flattening ragged
dims ]), and the batch as components or a padded envelope (``padded.py``)."""

from . import views, metadata, padded, flatten, reshape  # noqa: F401  (register)
