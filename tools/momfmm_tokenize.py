#!/usr/bin/python3
"""Subword tokens for the text task, a sentencepiece model and token files: the command line of
momfmm.tokenizer (docs/design.md §8.8), run by momfmm_launcher.py. Usage: --help."""
from momfmm_launcher import launch

if __name__ == "__main__":
    launch("tokenize")
