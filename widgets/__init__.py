"""Reusable Qt views: the node editor, palette, inspector, plots and panels."""
