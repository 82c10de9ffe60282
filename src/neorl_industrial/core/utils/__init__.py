"""Small array, tree and random-number helpers used across the core, and the messages
that quote untrusted input."""

from neorl_industrial.core.utils.messages import quote, shorten, unknown_key, validation_lines
from neorl_industrial.core.utils.tree import tree_bytes, tree_where

__all__ = ["quote", "shorten", "tree_bytes", "tree_where", "unknown_key", "validation_lines"]
