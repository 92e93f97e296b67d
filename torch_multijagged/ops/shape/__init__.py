"""Shape and structure: views (``unsqueeze``/``expand``/``permute``/``transpose``/``view``/
``select``/``slice``/``cat``/``stack``, ``views.py``; ``diagonal``, ``diagonal.py``), metadata queries
(``metadata.py``), ``reshape``/``flatten``/``unflatten``/the ``split`` family/``narrow``
(``reshape.py``), merging and splitting ragged dims (``flatten.py``, NOTE [ Flattening ragged
dims ]), elements regrouped across a ragged dim (``regroup.py``, NOTE [ Regrouping across a
ragged dim ]), the batch as components or a padded envelope (``padded.py``), static dims moved
before the batch dim (``leading.py``, NOTE [ Batch-moved tokens ]), the batch merged with the
static dims after it (``merged.py``, NOTE [ Batch-merged tokens ]), and per-sample matrix
structure: ``tril``/``triu``/``trace``/``diag``/``diagflat`` (``matrices.py``), and the ``*_copy``
variants of the views (``copies.py``)."""

from . import views, diagonal, metadata, padded, flatten, reshape, leading, merged, matrices, copies  # noqa: F401  (register)
