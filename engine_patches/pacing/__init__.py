"""Emulating a target chip and model on a CPU worker: the hook that paces SGLang's
forward passes to their roofline time (the model itself is in :mod:`capacity`)."""
