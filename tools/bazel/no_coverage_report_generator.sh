#!/bin/sh
# Bazel names a coverage report generator for every test target; its default is a download (@remote_coverage_tools)
# that these machines cannot reach. This one only says so: `bazel coverage` is not supported in this workspace.
echo "bazel coverage: no coverage report generator offline (the default one is downloaded from the network)" >&2
exit 1
