#!/bin/sh
# A stand-in for MUSA's mcc in tests: g++ reading the .mu sources as C++.
exec g++ -x c++ "$@"
