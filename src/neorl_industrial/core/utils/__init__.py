"""Small array, tree and random-number helpers used across the core."""

from neorl_industrial.core.utils.tree import tree_bytes, tree_where

__all__ = ["tree_bytes", "tree_where"]
