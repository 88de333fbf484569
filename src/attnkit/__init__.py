"""attnkit: one attention decoder for translation and image captioning.

The package is organised as the method is: ``interfaces`` (the encoder contract),
``attention`` (score functions), ``decoder`` (the shared attention decoder),
``encoders`` (text and image), ``model`` (encoder + decoder + losses), ``search``
(greedy and beam search), ``train`` (a model-agnostic trainer) and ``checkpoint``.
"""

__version__ = "0.1.0"

from attnkit.errors import UserError

__all__ = ["UserError", "__version__"]
