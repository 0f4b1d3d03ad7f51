#!/bin/sh
# autogen.sh — regenerate configure and Makefile.in from configure.ac, Makefile.am and m4/.
# Run once after a fresh clone (build.sh does it for you).
set -e
cd "$(dirname "$0")"
autoreconf -fi
