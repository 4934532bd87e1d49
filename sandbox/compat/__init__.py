"""Compatibility layers that reproduce other projects' sandbox interfaces."""
