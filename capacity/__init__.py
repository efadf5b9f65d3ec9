"""The capacity model: what a target model on target chips can do, in one package.

================  ===============================================================
``roofline``      the time of one forward pass on ``n`` chips (compute vs memory)
``profiles``      the chips and target models of ``profiles/*.yaml``, validated
``pacing``        what one paced server emulates (the spec the pacing hook reads)
``plan``          the planner: size each design for a trace under an SLA, BCR
``bathtub``       throughput and benefit per cost against the prefix-hit ratio
================  ===============================================================

Pure computation: no process, file or network. The pacing hook (SGLang side), the
``testbed plan`` command and the bench use it; the bench writes its tables into the
run directory, and reports render those files.
"""
