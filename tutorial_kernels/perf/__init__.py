"""Performance machinery the chapters' tuned launchers share: remembered launches (`launch_plan`) and
their direct form through Triton's C launcher (`direct_launch`), the autotuner's choices kept for the
process (`autotune`) and the scratch memory of TMA descriptors (`descriptors`). Nothing here knows
about attention's maths; no module here imports a chapter."""
