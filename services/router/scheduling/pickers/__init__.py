"""Pickers: turn scored candidates into the ranked list the edge tries in order."""
