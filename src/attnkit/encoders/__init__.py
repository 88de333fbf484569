"""Encoders: each turns one kind of input into an :class:`attnkit.interfaces.EncoderOutput`."""

from attnkit.encoders.text import TextEncoder

__all__ = ["TextEncoder"]
