#!/usr/bin/env bash
# momfmm against llm.c's CPU trainer, side by side (docs/design.md §8.10):
# writes a random-weight GPT-2 124M checkpoint and token files in llm.c's
# formats, runs the train_gpt2 binary you built in your own llm.c checkout
# (its Makefile: `make train_gpt2`; nothing here fetches or builds llm.c) and
# `momfmm bench` at the same shape, at 1 and 2 threads, in alternating
# rounds, and prints a table of tokens/s and their ratio per pair.
#
#   tools/bench_llmc.sh ~/llm.c/train_gpt2 [--momfmm build/momfmm] [--threads 1,2] [--rounds 3]
#   tools/bench_llmc.sh --help
# The work is done by bench_llmc.py beside this script (Python with numpy:
# $PYTHON, default /usr/bin/python3); its docstring says what is timed.
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
exec "${PYTHON:-/usr/bin/python3}" "$here/bench_llmc.py" "$@"
