#!/usr/bin/env bash
# Fetches the wheels tools/device_check needs on the accelerator machine (Python 3.12, x86-64, no package index)
# into .whl/ (git-ignored), for the device tool to carry. Run from the repository root; needs pip and the index.
#
# jaxpt's own imports:   ml_collections tensorboardx, and tensorflow-datasets with what it needs and the image
#                        lacks: array_record dm-tree promise simple_parsing docstring-parser tensorflow-metadata
#                        googleapis-common-protos termcolor toml
# tokamax (kernel peer): tokamax einshape pydantic pydantic-core annotated-types typing-inspection typing-extensions
#                        qwix immutabledict, and xprof (32 MB: tokamax imports its kernel-stats tool) gviz_api
# All together 46 MB; with the working tree's 15 MB (2026-11-28) that is close to the device tool's 64 MiB: a check
# that runs no tokamax (its two_stream_norm section) can leave xprof's 30 MB wheel out of .whl/.
# Versions: the ones installed where the check was prepared; pydantic-core must be the one pydantic pins.
set -euo pipefail
WHEELS=(
  ml_collections==1.1.0 tensorboardx==2.6.5
  tensorflow-datasets==4.9.10 array_record==0.8.6 dm-tree==0.1.10 simple_parsing==0.1.9
  docstring-parser==0.18.0 tensorflow-metadata==1.21.0 googleapis-common-protos==1.76.0 termcolor==3.3.0
  toml==0.10.2
  tokamax==0.0.17 einshape==1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
  typing-inspection==0.4.5 typing-extensions==4.16.0 qwix==0.1.8 immutabledict==4.3.1 xprof==2.24.2 gviz_api==1.10.0
)
SOURCE_ONLY=(promise==2.3)  # pure Python, published as a source archive only: built into a wheel here
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d .whl "${WHEELS[@]}"
python3 -m pip wheel -q --no-deps -w .whl "${SOURCE_ONLY[@]}"
du -sh .whl
