"""Emulating a target chip and model on a CPU worker (issue 8): the roofline time of a
forward pass, and (to come) the hook that paces SGLang's forward passes to it."""
