"""ferry's data in other frameworks' data-loading protocols.

- :mod:`ferry.client.integrations.map_style`: ``MapStyleView`` (a ``torch.utils.data.Dataset``) and
  ``StreamSampler`` (a ``Sampler``) for code that insists on map-style datasets.
- :mod:`ferry.client.integrations.torchtitan`: ``FerryDataLoader``, a torchtitan data loader
  (needs the ``torchtitan`` extra; imported only when asked for).
- :mod:`ferry.client.integrations.vocab`: ``check_tokenizer``, whether a job's tokenizer can be the one a
  dataset was tokenized with (``FerryDataLoader`` checks torchtitan's).

Each adapter reuses the loader's order and state (:mod:`ferry.client.sampling.partition`,
:mod:`ferry.client.resume.state`): the samples and the resumable state are TokenLoader's.
"""

from __future__ import annotations

from .map_style import MapStyleView, StreamSampler

__all__ = ["MapStyleView", "StreamSampler"]
